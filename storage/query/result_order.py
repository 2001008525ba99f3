"""The order of a result whose statement gives none: one rule for every door and engine.

SQL promises no row order without `ORDER BY`, and each engine returns such rows in its own
(Spark: whatever its tasks produce). Every door (`tenant-windows sql`, the query service over
HTTP, the Postgres door) therefore prints such a result in one stable, documented order:

    **rows sorted by every output column, first to last, ascending, NULLs first**; a column
    holding arrays, maps or structs is compared by its JSON text (Spark's `to_json`).

A statement with `ORDER BY` keeps its own order (rows that tie under it come in the engine's
order). A `LIMIT` (or `OFFSET`) without `ORDER BY` applies after the rule: the rows it keeps are
the first ones in that order, so the in-process engine and Spark pick the same rows.

`statement_order` reads a statement's tree; `order_rows` applies the rule to Arrow rows (the
in-process engine's, or any collected result); `order_frame` to a Spark frame before its limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class StatementOrder:
    """How a statement's result is ordered and cut."""

    ordered: bool
    """The statement has an `ORDER BY` of its own: its rows come in that order."""
    unlimited: exp.Query
    """The statement without its outermost `LIMIT`/`OFFSET` where it has no `ORDER BY` (the
    rule orders the rows first, then `limit`/`offset` cut them); else the statement itself."""
    limit: int | None = None
    offset: int = 0

    def cut(self, table: pa.Table) -> pa.Table:
        """`table` (the unlimited statement's rows, in the rule's order) cut as the statement's
        `LIMIT`/`OFFSET` say."""
        rows = table.num_rows - self.offset if self.limit is None else self.limit
        return table.slice(min(self.offset, table.num_rows), max(rows, 0))


def statement_order(tree: exp.Query) -> StatementOrder:
    """Whether `tree` orders its rows; where it does not, the statement to run before the rule
    orders and its own `LIMIT`/`OFFSET` cut (None for a limit that is not a plain number:
    such a statement is left as it is)."""
    if tree.args.get("order") is not None:
        return StatementOrder(True, tree)
    limit, offset = tree.args.get("limit"), tree.args.get("offset")
    if limit is None and offset is None:
        return StatementOrder(False, tree)
    count = _number(limit.expression if limit is not None else None)
    skip = _number(offset.expression if offset is not None else None)
    if (limit is not None and count is None) or (offset is not None and skip is None):
        return StatementOrder(False, tree)
    unlimited = tree.copy()
    unlimited.set("limit", None)
    unlimited.set("offset", None)
    return StatementOrder(False, unlimited, count, skip or 0)


def _number(node: exp.Expr | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


def order_rows(table: pa.Table) -> pa.Table:
    """`table`'s rows in the rule's order (see the module's doc)."""
    if table.num_rows < 2 or table.num_columns == 0:
        return table
    keys: dict[str, pa.Array | pa.ChunkedArray] = {}
    for position, column in enumerate(table.columns):
        if pa.types.is_floating(column.type):
            # Spark sorts NaN after every number; Arrow with the NULLs.
            keys[f"nan{position}"] = pc.is_nan(column)
        keys[f"k{position}"] = _sort_key(column)
    indices = pc.sort_indices(
        pa.table(keys), sort_keys=[(name, "ascending", "at_start") for name in keys]
    )
    return table.take(indices)


def _sort_key(column: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    data_type = column.type
    if pa.types.is_nested(data_type):
        # Imported here: the text of nested values is spark_text's, which most callers skip.
        from storage.query.spark_text import json_text

        return pa.array([json_text(data_type, value) for value in column.to_pylist()], pa.string())
    if pa.types.is_dictionary(data_type):
        return column.cast(data_type.value_type)
    return column


def order_frame(frame: DataFrame) -> DataFrame:
    """`frame` in the rule's order, as Spark sorts: before a limit, so the rows a limit keeps
    are the ones the in-process engine keeps. A result holding a type Spark cannot sort by
    (an interval) keeps Spark's order."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType, VariantType

    keys = []
    for position, field in enumerate(frame.schema.fields):
        column = frame[position]  # by position: a result may repeat a column name
        if isinstance(field.dataType, ArrayType | MapType | StructType | VariantType):
            column = F.to_json(column)
        keys.append(column.asc_nulls_first())
    try:
        return frame.orderBy(*keys)
    except AnalysisException:
        # A type Spark cannot order (an interval): its rows in Spark's own order, as before.
        return frame

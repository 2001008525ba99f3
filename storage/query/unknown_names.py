"""A statement's unknown column, named with the columns it could mean, before any engine runs.

Spark says a column does not exist only once its session has started and the views are
registered: seconds for `tenant-windows sql`. A misspelled column is the commonest mistake, so
`sql` looks for it first, on the guarded tree and the views' schemas, and refuses it at once.

Deny nothing that Spark would accept: the check names a column unknown only where it is sure.
A name is known if any view has a column of that name, or the statement defines it anywhere
(an alias, a CTE's or a subquery's output, a `VALUES` table's columns, a lateral view); a
column qualified by something that is not a relation of the statement (a map's key, `m.k`)
is not looked at; and a statement whose derived tables output columns without a name of their
own (`SELECT count(*) FROM ...` in a CTE, read back as `` `count(1)` ``) is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from sqlglot import exp

from storage.query.sql_guard import did_you_mean


class UnknownColumnError(ValueError):
    """A column no view has and the statement does not define."""


def check_columns(tree: exp.Query, views: Mapping[str, Sequence[str]]) -> None:
    """`UnknownColumnError` (with the columns it could mean) for the first column of `tree` that no
    view of `views` (name: its columns) has and the statement does not define."""
    every_column = {column.lower() for columns in views.values() for column in columns}
    defined = _defined_names(tree)
    if defined is None:
        return
    relations = {name.lower() for name in _relation_names(tree)}
    named_views = [name for name in relations if name in views]
    for column in tree.find_all(exp.Column):
        if not isinstance(column.this, exp.Identifier):
            continue  # `t.*`
        qualifier = column.table.lower()
        if qualifier and qualifier not in relations:
            continue  # a map's key or a struct's field, which Spark resolves
        name = column.name.lower()
        if name in every_column or name in defined:
            continue
        candidates = {c.lower() for view in named_views for c in views[view]} | defined
        listing = ", ".join(sorted(candidates)) if len(candidates) <= 30 else None
        raise UnknownColumnError(
            f"unknown column {column.name!r}: {did_you_mean(name, candidates)}"
            + (f"the columns are {listing}" if listing else "no view has it")
        )


def _defined_names(tree: exp.Query) -> set[str] | None:
    """The names the statement defines; None where a derived table's output has a name of
    Spark's making, which is not checked."""
    names: set[str] = set()
    for node in tree.walk():
        if isinstance(node, exp.Alias):
            names.add(node.alias.lower())
        elif isinstance(node, exp.TableAlias):
            names.update(column.name.lower() for column in node.columns)
        elif isinstance(node, exp.CTE | exp.Subquery):
            query = node.this
            if isinstance(query, exp.Select) and any(
                not isinstance(projection, exp.Alias | exp.Column | exp.Star)
                for projection in query.expressions
            ):
                return None
    return names


def _relation_names(tree: exp.Query) -> Iterator[str]:
    for table in tree.find_all(exp.Table):
        yield table.name
        if table.alias:
            yield table.alias
    for node in tree.find_all(exp.Subquery, exp.Lateral, exp.CTE):
        if node.alias:
            yield node.alias

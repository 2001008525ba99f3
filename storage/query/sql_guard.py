"""The allow-list a tenant-scoped SQL statement must pass before Spark sees it (contract §6).

`tenant-windows sql --tenant T` is a security boundary: whatever the statement, it may read
only T's rows. Spark SQL can reach much more than the registered views (file relations such as
``parquet.`path` ``, other catalogs, `reflect` into the JVM, script transforms, session
settings), so the statement is parsed with sqlglot and accepted only if every part of it is
known to be harmless. Anything the guard does not recognise is refused: deny by default.

Three independent checks, each deny-by-default:
- the token stream: no hints, and every `name(` call names an allow-listed function;
- the syntax tree: exactly one query, built only from allow-listed node types, reading only the
  registered views (and the statement's own CTEs, in scope), unqualified;
- functions in the tree: sqlglot's typed function nodes must be allow-listed classes, untyped
  ones allow-listed names.
The CLI then checks Spark's own parse and plan of the accepted text (`storage.query.spark_views`).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError

DIALECT = "spark"


class QueryRefused(Exception):  # noqa: N818 - a refusal, not a failure
    """A statement the tenant-scoped SQL guard does not accept, and why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class UnknownRelation(QueryRefused):
    """A statement naming a relation that is no view: refused by every door (Spark has none
    such either), with the views it could mean."""


def did_you_mean(name: str, candidates: Collection[str]) -> str:
    """ "did you mean 'x'? " with the candidates closest to `name`, or nothing."""
    close = difflib.get_close_matches(name.lower(), sorted(candidates), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Pure Spark SQL functions: computed from their arguments (or the clock) only. Nothing here
# reads a file, names a class, runs a program, reveals the session, or changes state.
ALLOWED_FUNCTIONS = _words(
    """
    count sum avg mean min max first last first_value last_value any_value collect_list
    collect_set array_agg count_if approx_count_distinct approx_percentile percentile
    percentile_approx percentile_cont percentile_disc median mode stddev stddev_pop stddev_samp
    std variance var_pop var_samp corr covar_pop covar_samp bool_and bool_or every some any
    max_by min_by kurtosis skewness grouping grouping_id bit_and bit_or bit_xor listagg
    string_agg
    row_number rank dense_rank percent_rank cume_dist ntile lag lead nth_value
    concat concat_ws upper lower ucase lcase length char_length character_length len substr
    substring substring_index left right trim ltrim rtrim btrim lpad rpad replace translate
    regexp_replace regexp_extract regexp_extract_all regexp_like regexp_count regexp_substr
    regexp_instr split split_part instr locate position initcap reverse repeat format_string
    printf format_number startswith endswith contains ascii chr char base64 unbase64 hex unhex
    md5 sha1 sha2 sha crc32 hash xxhash64 levenshtein soundex space overlay elt find_in_set
    to_char to_varchar to_number try_to_number encode decode url_encode url_decode parse_url
    mask bit_length octet_length luhn_check like ilike rlike regexp between
    abs ceil ceiling floor round bround sqrt cbrt exp expm1 ln log log10 log2 log1p pow power
    mod pmod sign signum greatest least rand randn random pi e sin cos tan cot sec csc asin acos
    atan atan2 sinh cosh tanh asinh acosh atanh degrees radians factorial negative positive div
    try_add try_subtract try_multiply try_divide try_mod try_sum try_avg width_bucket bin conv
    shiftleft shiftright shiftrightunsigned isnan nanvl uuid hypot rint
    current_date current_timestamp now localtimestamp current_timezone date_add date_sub dateadd
    datediff date_diff add_months months_between date_format date_trunc trunc to_date
    to_timestamp to_timestamp_ltz to_timestamp_ntz try_to_timestamp to_unix_timestamp
    unix_timestamp from_unixtime unix_millis unix_seconds unix_micros unix_date
    date_from_unix_date timestamp_millis timestamp_seconds timestamp_micros year quarter month
    day dayofmonth dayofweek dayofyear weekday weekofyear hour minute second last_day next_day
    make_date make_timestamp make_timestamp_ltz make_timestamp_ntz make_interval
    make_dt_interval make_ym_interval extract date_part datepart from_utc_timestamp
    to_utc_timestamp convert_timezone window session_window window_time timestampadd
    timestampdiff
    coalesce nvl nvl2 ifnull nullif if isnull isnotnull equal_null nullifzero zeroifnull
    cast try_cast boolean tinyint smallint int bigint float double decimal date timestamp
    string binary typeof
    get_json_object json_tuple from_json to_json schema_of_json json_array_length
    json_object_keys parse_json try_parse_json variant_get try_variant_get
    array map struct named_struct array_contains array_distinct array_except array_intersect
    array_union array_join array_max array_min array_position array_remove array_repeat
    array_sort sort_array arrays_overlap arrays_zip array_size size cardinality element_at
    try_element_at explode explode_outer posexplode posexplode_outer inline inline_outer stack
    flatten sequence slice shuffle map_keys map_values map_entries map_from_arrays
    map_from_entries map_concat map_contains_key map_filter map_zip_with transform
    transform_keys transform_values filter exists forall aggregate reduce zip_with array_append
    array_prepend array_compact array_insert get str_to_map
    """
)

# Keywords sqlglot tokenizes as such that may stand before "(" without being a function call.
_SYNTAX_BEFORE_PAREN = _words(
    """
    as in over values exists filter within group rollup cube sets tablesample pivot unpivot and
    or not when then else select from join on using where having by case all distinct with
    union intersect except minus is between like ilike rlike escape interval partition order
    """
)

# Syntax-tree nodes that only shape a query: selection, joins, grouping, ordering, operators,
# literals, types. A node type not here (or a function below) is refused.
_STRUCTURAL_NODES: tuple[type[exp.Expr], ...] = (
    exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Subquery, exp.With, exp.CTE,
    exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Offset, exp.Distinct, exp.Qualify, exp.Lateral, exp.TableSample, exp.Values,
    exp.Column, exp.Identifier, exp.Star, exp.Table, exp.TableAlias, exp.Alias, exp.Aliases,
    exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Tuple, exp.Bracket, exp.Dot,
    exp.DataType, exp.DataTypeParam, exp.ColumnDef, exp.Schema, exp.Interval, exp.IntervalSpan,
    exp.Var, exp.Window, exp.WindowSpec, exp.Filter, exp.WithinGroup, exp.Lambda, exp.Kwarg,
    exp.Cube, exp.Rollup, exp.GroupingSets, exp.In, exp.Between, exp.Is, exp.Like, exp.ILike,
    exp.RegexpLike, exp.Not, exp.Neg, exp.BitwiseNot, exp.Exists, exp.Any, exp.All,
    exp.Case, exp.If, exp.Cast, exp.TryCast,
    exp.JSONPath, exp.JSONPathKey, exp.JSONPathRoot, exp.JSONPathSubscript, exp.JSONPathWildcard,
    exp.Pivot, exp.PivotAlias, exp.Slice,
)  # fmt: skip


def check_query(statement: str, views: Collection[str]) -> exp.Query:
    """The one read-only query in `statement`, if it reads only `views`; else `QueryRefused`.

    `views` are the names of the registered (tenant-scoped) views, compared case-insensitively
    as Spark does.
    """
    allowed_views = {name.lower() for name in views}
    tokens = _tokens(statement)
    _check_tokens(tokens)
    tree = _parse_one(statement)
    for node in tree.walk():
        _check_node(node, allowed_views)
    return tree


def _tokens(statement: str) -> list[Token]:
    if not statement.strip():
        raise QueryRefused("the statement is empty")
    if "${" in statement:
        # Spark substitutes ${env:NAME}, ${system:NAME}, ${spark:key} into the text before it
        # parses it, string literals included: a way to read the environment.
        raise QueryRefused("${...} variable substitution is refused")
    if "/*+" in statement:
        raise QueryRefused("hints (/*+ ... */) are refused: they direct the planner, not the query")
    try:
        return Spark.Tokenizer().tokenize(statement)
    except (TokenError, ParseError) as error:
        raise QueryRefused(f"the statement cannot be read: {_first_line(error)}") from error


def _check_tokens(tokens: list[Token]) -> None:
    for position, token in enumerate(tokens):
        previous = tokens[position - 1] if position > 0 else None
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        if token.token_type is TokenType.HINT:
            raise QueryRefused("hints (/*+ ... */) are refused: they direct the planner")
        if any("/*" in comment or "*/" in comment for comment in token.comments):
            # Spark and sqlglot may close nested comments differently; the text between
            # would then be a comment to one and SQL to the other.
            raise QueryRefused("nested comments are refused: /* inside /* ... */")
        if following is None or following.token_type is not TokenType.L_PAREN:
            continue
        if previous is not None and previous.token_type is TokenType.ALIAS:
            continue  # `AS name(col, ...)`: a column alias list, not a call
        name = token.text.lower()
        is_name = token.token_type in (TokenType.VAR, TokenType.IDENTIFIER)
        if name in ALLOWED_FUNCTIONS or not (is_name or name.isidentifier()):
            continue  # an allowed call, or an operator or punctuation before "("
        if is_name or name not in _SYNTAX_BEFORE_PAREN:
            raise QueryRefused(_function_refusal(token.text))


def _parse_one(statement: str) -> exp.Query:
    try:
        parsed = [tree for tree in sqlglot.parse(statement, read=DIALECT) if tree is not None]
    except Exception as error:  # sqlglot's function builders raise anything on odd arguments
        raise QueryRefused(f"the statement cannot be parsed: {_first_line(error)}") from error
    if len(parsed) != 1:
        raise QueryRefused(f"exactly one statement is accepted, found {len(parsed)}")
    [tree] = parsed
    if not isinstance(tree, exp.Select | exp.SetOperation | exp.Subquery):
        kind = "a command" if isinstance(tree, exp.Command) else type(tree).__name__.upper()
        raise QueryRefused(
            f"only a read-only query (SELECT or WITH ... SELECT) is accepted, not {kind}: "
            f"{_head(statement)}"
        )
    return tree


def _check_node(node: exp.Expr, views: set[str]) -> None:
    if isinstance(node, exp.Table):
        _check_relation(node, views)
    elif isinstance(node, exp.With) and node.args.get("recursive"):
        raise QueryRefused("WITH RECURSIVE is refused")
    if isinstance(node, _STRUCTURAL_NODES) or type(node) in _BINARY_OPERATORS:
        return
    if isinstance(node, exp.Anonymous):
        if node.name.lower() not in ALLOWED_FUNCTIONS:
            raise QueryRefused(_function_refusal(node.name))
        return
    if type(node) in _ALLOWED_FUNCTION_NODES:
        return
    if isinstance(node, exp.Func):
        raise QueryRefused(_function_refusal(node.sql_name().lower()))
    raise QueryRefused(f"{_describe(node)} is not allowed in a tenant-scoped query")


def _check_relation(table: exp.Table, views: set[str]) -> None:
    if not isinstance(table.this, exp.Identifier):
        raise QueryRefused(
            f"table-valued functions are refused ({table.this.sql(DIALECT)}): "
            f"read the views {_listing(views)}"
        )
    if table.args.get("db") or table.args.get("catalog"):
        raise QueryRefused(
            f"qualified or file relations are refused ({table.sql(DIALECT)}): "
            f"name a view, one of {_listing(views)}"
        )
    if _is_hint_argument(table):
        return
    name = table.name.lower()
    if name in views or name in _ctes_in_scope(table):
        return
    raise UnknownRelation(
        f"unknown relation {table.name!r}: {did_you_mean(name, views)}the views are "
        f"{_listing(views)}"
    )


def _is_hint_argument(table: exp.Table) -> bool:
    return isinstance(table.parent, exp.JoinHint)


def _ctes_in_scope(table: exp.Table) -> set[str]:
    """CTE names `table` may refer to: those of every enclosing WITH, except, inside a CTE's
    own body, that CTE and the ones after it (Spark's non-recursive scoping)."""
    names: set[str] = set()
    child: exp.Expr = table
    for ancestor in _ancestors(table):
        with_clause = ancestor.args.get("with_") if not isinstance(ancestor, exp.With) else None
        if isinstance(ancestor, exp.With):
            ctes = list(ancestor.expressions)
            visible = ctes[: ctes.index(child)] if child in ctes else ctes
            names.update(cte.alias.lower() for cte in visible)
        elif isinstance(with_clause, exp.With) and child is not with_clause:
            names.update(cte.alias.lower() for cte in with_clause.expressions)
        child = ancestor
    return names


def _ancestors(node: exp.Expr) -> Iterator[exp.Expr]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _function_refusal(name: str) -> str:
    return (
        f"function {name!r} is not on the allow-list of pure Spark SQL functions "
        "(see docs/querying.md)"
    )


def _describe(node: exp.Expr) -> str:
    names: dict[type[exp.Expr], str] = {
        exp.QueryTransform: "TRANSFORM ... USING (a script transform runs a program)",
        exp.Hint: "a hint",
        exp.Command: "a command",
    }
    return names.get(type(node), f"{type(node).__name__} ({_head(node.sql(DIALECT))})")


def _head(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 60 else flat[:57] + "..."


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _listing(views: Collection[str]) -> str:
    return ", ".join(sorted(views))


def _function_nodes() -> frozenset[type[exp.Expr]]:
    """Every node type sqlglot's Spark parser builds for a call of an allow-listed function.

    Derived from the names, so the two lists cannot drift apart: sqlglot turns most names into
    a typed node (`upper` into `Upper`, `collect_list` into `ArrayAgg`), some into several.
    """
    found: set[type[exp.Expr]] = set()
    for name in sorted(ALLOWED_FUNCTIONS):
        for arguments in ("a", "a, b", "a, b, c", ""):
            try:
                call = sqlglot.parse_one(f"SELECT {name}({arguments})", read=DIALECT)
            except Exception:  # sqlglot's builders raise anything on a wrong number of arguments
                continue
            found.update(type(node) for node in call.walk() if node is not call)
            break
    return frozenset(found - {exp.Column, exp.Anonymous})


def _binary_operators() -> frozenset[type[exp.Expr]]:
    """Arithmetic, comparison, logical and bitwise operators, and `||`: pure by construction."""
    return frozenset(
        cls
        for cls in _all_subclasses(exp.Binary)
        if cls.__module__.startswith("sqlglot.expressions")
        and not issubclass(cls, exp.Func)
        and cls not in (exp.Dot,)
    ) | frozenset({exp.Connector, exp.And, exp.Or, exp.Xor})


def _all_subclasses(cls: type[exp.Expr]) -> Iterator[type[exp.Expr]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


_ALLOWED_FUNCTION_NODES = _function_nodes()
_BINARY_OPERATORS = _binary_operators()

"""Tenant lists: many tenants onboarded at once, each naming a shared rule set.

`conf/rule_sets.yaml` defines named rule sets once; each `conf/tenant_lists/*.csv` holds rows of
`tenant_id,rule_set` (a header line, then one tenant a row), as a database exports them. A listed
tenant costs an id and a reference to its rule set: a million tenants that name the same rule set
share one validated, frozen `RuleSet`, not a million models.

`TenantDirectory` is the registry's view of all tenants, from files and from lists, by id; a
listed tenant's `TenantConfig` is built from its rule set only when one is asked for.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tenants.field_suggestions import closest_field
from tenants.models import ID_PATTERN, RuleSet, TenantConfig

RULE_SETS_FILE = "rule_sets.yaml"
TENANT_LISTS_DIR = "tenant_lists"
LIST_SUFFIX = ".csv"
LIST_HEADER = ("tenant_id", "rule_set")
# A list with thousands of bad rows is reported by its first ones, not a screen per row.
MAX_PROBLEMS = 20
_ID_RE = re.compile(ID_PATTERN)
ID_PROBLEM = "must match ^[a-z0-9][a-z0-9_-]{0,62}$ (an id is a path component)"


@runtime_checkable
class SourceIdIndex(Protocol):
    """A tenants mapping that can list a tenant's source ids without building its config."""

    def source_ids(self, tenant_id: str) -> Collection[str]: ...

    def overrides_nothing(self, tenant_id: str, source: str) -> bool:
        """Whether the tenant sends `source` with the source's own rules, all unchanged."""
        ...

    def sets_quota(self, tenant_id: str) -> bool:
        """Whether the tenant's config has a `quota` of its own."""
        ...


class TenantListError(ValueError):
    """A tenant list that cannot be accepted: (field, problem) pairs, each field naming a line
    (`line 12: tenant_id`). The registry turns it into a `ConfigError` naming the file."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{where}: {problem}" for where, problem in problems))


@dataclass(frozen=True)
class TenantList:
    """One list file: each tenant id and the name of its rule set, in the file's order."""

    rule_set_of: dict[str, str]
    """Tenant id -> rule set name; the names are shared strings, one per distinct name."""
    rule_set_names: frozenset[str]


def parse_tenant_list(data: bytes) -> TenantList:
    """A list file's rows; raise `TenantListError` naming the line and field of each problem.

    The file is CSV: the header `tenant_id,rule_set`, then a row per tenant. Blank lines are
    skipped; fields may be quoted and padded with spaces, as spreadsheet and database exports
    write them; a UTF-8 byte order mark is allowed.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise TenantListError([("(file)", f"not UTF-8 text: {error}")]) from None
    fast = _plain_rows(text)
    if fast is not None:
        return fast
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(name.strip().lower() for name in header) != LIST_HEADER:
        raise TenantListError(
            [("line 1", f"the first line must be the header `{','.join(LIST_HEADER)}`")]
        )
    rule_set_of: dict[str, str] = {}
    names: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    duplicates: dict[str, int] = {}
    for line, row in enumerate(reader, start=2):
        if len(row) != 2:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # a blank line
            problems.append(
                (f"line {line}", f"has {len(row)} fields; a row is `tenant_id,rule_set`")
            )
            continue
        tenant, rule_set = row[0].strip(), row[1].strip()
        name = names.get(rule_set)
        if name is None:
            if not _ID_RE.fullmatch(rule_set):
                problems.append((f"line {line}: rule_set", f"{rule_set!r} {ID_PROBLEM}"))
                continue
            name = names[rule_set] = rule_set
        if not _ID_RE.fullmatch(tenant):
            problems.append((f"line {line}: tenant_id", f"{tenant!r} {ID_PROBLEM}"))
            continue
        if tenant in rule_set_of:
            duplicates.setdefault(tenant, line)
            problems.append((f"line {line}: tenant_id", f"tenant {tenant!r} is listed twice"))
            continue
        rule_set_of[tenant] = name
        if len(problems) > MAX_PROBLEMS:
            break
    if problems:
        raise TenantListError(_with_first_lines(problems[:MAX_PROBLEMS], text, duplicates))
    return TenantList(rule_set_of, frozenset(names.values()) & frozenset(rule_set_of.values()))


_ID_TEXT = ID_PATTERN.removeprefix("^").removesuffix("$")
_PLAIN_ROWS = re.compile(rf"(?:{_ID_TEXT},{_ID_TEXT}\n)*")
_FIRST_COLUMN = re.compile(r"^([^,\n]*),", re.MULTILINE)
_SECOND_COLUMN = re.compile(r",([^,\n]*)$", re.MULTILINE)


def _plain_rows(text: str) -> TenantList | None:
    """A list's rows when every row is `id,name` with nothing else (no quotes, spaces or blank
    lines) and no tenant is listed twice, else None. Checked and split by the regex engine in
    a few passes over the text: a million rows in a fraction of a second, where a loop over
    rows in Python takes seconds. Anything else is read row by row, which names each problem."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    header, newline, body = text.partition("\n")
    if not newline or header.strip().lower() != ",".join(LIST_HEADER):
        return None
    if body and not body.endswith("\n"):
        body += "\n"
    if not _PLAIN_ROWS.fullmatch(body):
        return None
    ids = _FIRST_COLUMN.findall(body)
    names = _SECOND_COLUMN.findall(body)
    shared = {name: name for name in set(names)}
    rule_set_of = dict(zip(ids, map(shared.__getitem__, names), strict=True))
    if len(rule_set_of) != len(ids):
        return None  # a tenant listed twice: the row-by-row reading names the lines
    return TenantList(rule_set_of, frozenset(shared))


_ID_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_-")
MAX_MENTIONS = 1_000
"""A lookup that meets an id this often in a list (a short id inside many others) reads the
list as a whole instead."""


def rows_naming(data: bytes, tenant_id: str) -> list[str] | None:
    """The rule sets that plain rows `<tenant_id>,<rule set>` of a list file's bytes name, found
    by searching the bytes for the id: one tenant's lookup in a list of a million rows costs a
    search, not a parse. None where the bytes mention the id otherwise than in such a row, as a
    rule set's name, or inside a longer id (quoted, padded, in a row of three fields): only
    reading the whole list (`parse_tenant_list`) says what such a row means."""
    needle = tenant_id.encode()
    names: list[str] = []
    start = data.find(needle)
    for _ in range(MAX_MENTIONS):
        if start == -1:
            return names
        end = start + len(needle)
        before = data[start - 1] if start else None
        after = data[end] if end < len(data) else None
        if before in _ID_BYTES or after in _ID_BYTES:
            pass  # a longer id that holds this one
        elif before == ord("\n") and after == ord(","):
            line_end = data.find(b"\n", end)
            name = data[end + 1 : None if line_end == -1 else line_end].removesuffix(b"\r")
            if not _ID_RE.fullmatch(name.decode("utf-8", "replace")):
                return None
            names.append(name.decode())
        elif not (before == ord(",") and after in (ord("\n"), ord("\r"), None)):
            return None  # not a rule set's name either
        start = data.find(needle, end)
    return None


def _with_first_lines(
    problems: list[tuple[str, str]], text: str, duplicates: dict[str, int]
) -> list[tuple[str, str]]:
    """`problems`, each "listed twice" naming the line the tenant is first listed on: found by
    reading the file again, so a valid list keeps no line numbers."""
    if not duplicates:
        return problems
    first = {tenant: line for tenant, line in first_lines(text, duplicates.keys()).items()}
    return [
        (where, f"{problem} (first on line {first[tenant]}); keep one row per tenant")
        if (tenant := _listed_twice(problem)) is not None and tenant in first
        else (where, problem)
        for where, problem in problems
    ]


def _listed_twice(problem: str) -> str | None:
    match = re.fullmatch(r"tenant '(.+)' is listed twice", problem)
    return match.group(1) if match else None


def first_lines(text: str, tenants: Iterable[str]) -> dict[str, int]:
    """The line each of `tenants` is first listed on in a list file's text (errors only)."""
    wanted = set(tenants)
    found: dict[str, int] = {}
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    next(reader, None)
    for line, row in enumerate(reader, start=2):
        if row and (tenant := row[0].strip()) in wanted and tenant not in found:
            found[tenant] = line
    return found


def first_line_naming(text: str, rule_set: str) -> int | None:
    """The first line of a list file's text that names `rule_set` (errors only)."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff")))
    next(reader, None)
    for line, row in enumerate(reader, start=2):
        if len(row) == 2 and row[1].strip() == rule_set:
            return line
    return None


def unknown_rule_set_problem(rule_set: str, known: Collection[str], defined_in: Path) -> str:
    """What is wrong with a list row naming `rule_set`, which `defined_in` does not define."""
    suggestion = closest_field(rule_set, known)
    hint = (
        f"did you mean `{suggestion}`?" if suggestion else f"{defined_in} defines {sorted(known)}"
    )
    return f"unknown rule set {rule_set!r}; {hint}"


@dataclass(frozen=True)
class _RuleSetFacts:
    """What routing asks of a rule set, answered once per rule set rather than per tenant."""

    rule_set: RuleSet
    unchanged_sources: frozenset[str]  # the sources it sends with their rules unchanged

    @classmethod
    def of(cls, rule_set: RuleSet) -> _RuleSetFacts:
        unchanged = frozenset(
            name
            for name, overrides in rule_set.sources.items()
            if not overrides.model_fields_set or all(value is None for _, value in overrides)
        )
        return cls(rule_set, unchanged)


@dataclass(frozen=True)
class TenantDirectory(Mapping[str, TenantConfig]):
    """Every tenant by id: those with a config of their own (`own`, from tenant files or a
    snapshot) and those a tenant list names a rule set for (`listed`).

    An id is in at most one of them (the reader refuses it otherwise). Asked for a listed
    tenant, it builds its config from the shared rule set, and keeps nothing per lookup.
    """

    own: Mapping[str, TenantConfig]
    listed: Mapping[str, str]
    rule_sets: Mapping[str, RuleSet]
    _facts: dict[str, _RuleSetFacts] = field(init=False, repr=False, compare=False)
    _own_index: SourceIdIndex | None = field(init=False, repr=False, compare=False)
    # `listed.get`, or its one file's `dict.get`: asked once per key of every micro-batch.
    _rule_set_name: Callable[[str], str | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        facts = {name: _RuleSetFacts.of(rule_set) for name, rule_set in self.rule_sets.items()}
        object.__setattr__(self, "_facts", facts)
        own_index = self.own if isinstance(self.own, SourceIdIndex) else None
        object.__setattr__(self, "_own_index", own_index)
        listed = self.listed
        one_file = isinstance(listed, ListedTenants) and len(listed.files) == 1
        lookup = listed.files[0].get if one_file else listed.get  # type: ignore[attr-defined]
        object.__setattr__(self, "_rule_set_name", lookup)

    def __getitem__(self, tenant_id: str) -> TenantConfig:
        name = self._rule_set_name(tenant_id)
        if name is None:
            return self.own[tenant_id]
        return TenantConfig.of_rule_set(tenant_id, self.rule_sets[name])

    def __contains__(self, tenant_id: object) -> bool:
        listed = isinstance(tenant_id, str) and self._rule_set_name(tenant_id) is not None
        return listed or tenant_id in self.own

    def __iter__(self) -> Iterator[str]:
        yield from self.own
        yield from self.listed

    def __len__(self) -> int:
        return len(self.own) + len(self.listed)

    @property
    def rule_set_of(self) -> Callable[[str], str | None]:
        """Tenant id -> the name of the rule set a list names for it; None for a tenant
        file's (a function rather than a method: asked once per listed tenant in a diff)."""
        return self._rule_set_name

    def source_ids(self, tenant_id: str) -> Collection[str]:
        name = self._rule_set_name(tenant_id)
        if name is not None:
            return self.rule_sets[name].sources.keys()
        if self._own_index is not None:
            return self._own_index.source_ids(tenant_id)
        return self.own[tenant_id].sources.keys()

    def overrides_nothing(self, tenant_id: str, source: str) -> bool:
        name = self._rule_set_name(tenant_id)
        if name is not None:
            return source in self._facts[name].unchanged_sources
        if self._own_index is not None:
            return self._own_index.overrides_nothing(tenant_id, source)
        return False

    def sets_quota(self, tenant_id: str) -> bool:
        name = self._rule_set_name(tenant_id)
        if name is not None:
            return self.rule_sets[name].quota is not None
        if self._own_index is not None:
            return self._own_index.sets_quota(tenant_id)
        return self.own[tenant_id].quota is not None

    def any_sets_quota(self) -> bool:
        """Whether any tenant has a quota of its own: each rule set in use is looked at once."""
        in_use = self.rule_sets_in_use()
        if any(self.rule_sets[name].quota is not None for name in in_use):
            return True
        own_index = self._own_index
        if own_index is not None:
            return any(own_index.sets_quota(tenant) for tenant in self.own)
        return any(config.quota is not None for config in self.own.values())

    def rule_sets_in_use(self) -> frozenset[str]:
        """The names of the rule sets some listed tenant names."""
        if isinstance(self.listed, ListedTenants):
            return self.listed.rule_set_names
        return frozenset(self.listed.values())


@dataclass(frozen=True)
class ListedTenants(Mapping[str, str]):
    """Tenant id -> rule set name over one or more list files' rows, without copying them.

    A lookup asks each file in turn; there are a few list files, not thousands.
    """

    lists: tuple[TenantList, ...]
    files: tuple[dict[str, str], ...] = field(init=False, repr=False, compare=False)
    rule_set_names: frozenset[str] = field(init=False, repr=False, compare=False)
    """The names of the rule sets some listed tenant names."""

    def __post_init__(self) -> None:
        files = tuple(tenant_list.rule_set_of for tenant_list in self.lists)
        object.__setattr__(self, "files", files)
        names = frozenset().union(*(tenant_list.rule_set_names for tenant_list in self.lists))
        object.__setattr__(self, "rule_set_names", names)

    def __getitem__(self, tenant_id: str) -> str:
        for rows in self.files:
            name = rows.get(tenant_id)
            if name is not None:
                return name
        raise KeyError(tenant_id)

    def get(self, tenant_id: str, default: Any = None) -> Any:
        for rows in self.files:
            name = rows.get(tenant_id)
            if name is not None:
                return name
        return default

    def __contains__(self, tenant_id: object) -> bool:
        return any(tenant_id in rows for rows in self.files)

    def __iter__(self) -> Iterator[str]:
        for rows in self.files:
            yield from rows

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.files)


def listed_by_rule_set(listed: Mapping[str, str]) -> dict[str, list[str]]:
    """Rule set name -> the ids listed with it: how a snapshot stores list tenants (each rule
    set's name once, not once per tenant)."""
    lists = (
        listed.lists
        if isinstance(listed, ListedTenants)
        else (TenantList(dict(listed), frozenset(listed.values())),)
    )
    grouped: dict[str, list[str]] = {}
    for tenant_list in lists:
        rows, names = tenant_list.rule_set_of, tenant_list.rule_set_names
        if len(names) == 1:
            # The common case, one rule set for a whole list: its ids in one call.
            grouped.setdefault(next(iter(names)), []).extend(rows)
            continue
        for tenant, name in rows.items():
            ids = grouped.get(name)
            if ids is None:
                ids = grouped[name] = []
            ids.append(tenant)
    return grouped


def listed_from_groups(groups: Mapping[str, list[str]]) -> dict[str, str]:
    """The inverse of `listed_by_rule_set`: tenant id -> rule set name."""
    listed: dict[str, str] = {}
    for name, ids in groups.items():
        listed.update(dict.fromkeys(ids, name))
    return listed

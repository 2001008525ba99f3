"""Read `conf/` (sources, tenant files, rule sets and tenant lists) into a `TenantRegistry`,
again and again, doing work only for what changed.

There may be 100,000 tenant files: `ConfReader` keeps each file's validated config and reads a
file again only when its stat changed. Every problem is a `ConfigError` naming the file, the
field and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tenants.field_suggestions import problem_message
from tenants.models import (
    ID_PATTERN,
    RuleSet,
    SourceConfig,
    TenantConfig,
)
from tenants.registry import SOURCES_FILE, TENANTS_DIR, ConfigError, TenantRegistry
from tenants.tenant_lists import (
    LIST_SUFFIX,
    RULE_SETS_FILE,
    TENANT_LISTS_DIR,
    ListedTenants,
    TenantList,
    TenantListError,
    first_line_naming,
    first_lines,
    parse_tenant_list,
    rows_naming,
    unknown_rule_set_problem,
)

ModelT = TypeVar("ModelT", bound=BaseModel)
# pydantic names the chosen window kind in an error's path; the YAML has no such key.
WINDOW_KINDS = {"tumbling", "sliding", "session"}


def load_registry(conf_dir: Path) -> TenantRegistry:
    """Read and validate the whole config directory; raise `ConfigError` on the first bad file."""
    return ConfReader(conf_dir).load()


def load_tenant(conf_dir: Path, tenant_id: str) -> TenantConfig | None:
    """One tenant's config, or None if nothing defines it.

    A command about one tenant should not read 100,000 files, or parse a list of a million rows
    (seconds), to find it: read from `tenants/<id>.yaml` alone when that file defines the
    tenant, or else from the one plain row of the tenant lists that names it and its rule set.
    Anything less plain (a tenant defined in a file of another name, a quoted or padded row, a
    tenant listed twice, an unknown rule set) is decided by reading the whole directory, as
    `load_registry` does, which also names what is wrong.
    """
    if _is_valid_id(tenant_id):
        conventional = conf_dir / TENANTS_DIR / f"{tenant_id}.yaml"
        if conventional.is_file():
            tenant = _parse_tenant(conventional, conventional.read_bytes())
            if tenant.id == tenant_id:
                return tenant
        else:
            listed = _listed_tenant(conf_dir, tenant_id)
            if listed is not None:
                return listed
    return load_registry(conf_dir).tenants.get(tenant_id)


def _listed_tenant(conf_dir: Path, tenant_id: str) -> TenantConfig | None:
    """`tenant_id`'s config where exactly one plain list row names it and a rule set that
    `rule_sets.yaml` defines; None otherwise (`load_tenant` then reads everything)."""
    lists_dir = conf_dir / TENANT_LISTS_DIR
    rule_set_names: list[str] = []
    for name in sorted(_scan_files(lists_dir, (LIST_SUFFIX,))):
        try:
            rows = rows_naming((lists_dir / name).read_bytes(), tenant_id)
        except OSError:
            return None
        if rows is None:
            return None
        rule_set_names.extend(rows)
    if len(rule_set_names) != 1:
        return None
    rule_sets_path = conf_dir / RULE_SETS_FILE
    try:
        rule_sets = _parse_rule_sets(rule_sets_path, rule_sets_path.read_bytes())
    except (OSError, ConfigError):
        return None
    rule_set = rule_sets.get(rule_set_names[0])
    return None if rule_set is None else TenantConfig.of_rule_set(tenant_id, rule_set)


# A file stat that changes whenever its content may have: (size, mtime_ns, ctime_ns, inode).
# ctime catches a rewrite of the same size whose mtime was set back; the inode a file replaced
# by a rename, as editors and Kubernetes config maps do.
FileStat = tuple[int, int, int, int]
# Filesystems stamp mtimes coarsely (a clock tick locally, a second or two elsewhere): a file
# written again within the same tick and at the same size would keep its stat. Files modified
# this recently are therefore read again (and compared by digest) on every scan until older.
RACY_WINDOW_NS = 2_000_000_000
OutcomeT = TypeVar("OutcomeT")


@dataclass(frozen=True)
class _FileRead(Generic[OutcomeT]):
    """One file as last read: its stat, content digest and what validating it gave."""

    stat: FileStat | None  # None: unreadable, so read again on every scan
    digest: bytes
    outcome: OutcomeT | ConfigError
    racy: bool

    def is_current(self, stat: FileStat | None) -> bool:
        return stat is not None and stat == self.stat and not self.racy


class ConfReader:
    """Reads `conf/` into a registry again and again, doing work only for what changed.

    A scan stats every file (`os.scandir`); a file is read again only when its stat changed,
    and validated again only when its content digest did. The cross-file checks (duplicate
    ids, unknown sources) and the fingerprint are redone over the kept per-file results, so the
    registry is the same as a full `load_registry` of the directory would give.
    """

    def __init__(self, conf_dir: Path, read_bytes: Callable[[Path], bytes] = Path.read_bytes):
        self.conf_dir = conf_dir
        self._read_bytes = read_bytes
        self._sources: _FileRead[dict[str, SourceConfig]] | None = None
        self._rule_sets: _FileRead[dict[str, RuleSet]] | None = None
        self._tenants: dict[str, _FileRead[TenantConfig]] = {}
        # Tenant lists are few and large: one is read again only when its stat changed.
        self._lists: dict[str, _FileRead[TenantList]] = {}
        # The lists' rows merged (cross-list duplicates checked), as of these lists' digests.
        self._listed: tuple[tuple[bytes, ...], ListedTenants] | None = None
        self._order: list[str] = []  # the names of `_tenants` in `_file_order`
        self._outcome: TenantRegistry | ConfigError | None = None
        # The files whose content changed, appeared or disappeared in the last `load`.
        self.last_changed: tuple[Path, ...] = ()
        # Tenant files that say the same besides their id share one validated rule set.
        self._rule_sets_by_content: dict[str, RuleSet] = {}

    def load(self) -> TenantRegistry:
        """The registry of `conf/` as it is now; raise `ConfigError` naming the first bad file.

        When nothing changed since the last call, this returns (or raises) what it did then.
        """
        scan_started_ns = time.time_ns()
        changed: list[Path] = []
        sources_path = self.conf_dir / SOURCES_FILE
        sources = self._refreshed(
            sources_path, _stat(sources_path), self._sources, _parse_sources, scan_started_ns
        )
        if self._sources is None or sources.digest != self._sources.digest:
            changed.append(sources_path)
        self._sources = sources
        rule_sets_path = self.conf_dir / RULE_SETS_FILE
        rule_sets = self._refreshed(
            rule_sets_path,
            _stat(rule_sets_path),
            self._rule_sets,
            _parse_rule_sets,
            scan_started_ns,
            missing_means=_NO_RULE_SETS,
        )
        appeared = self._rule_sets is not None or rule_sets.outcome is not _NO_RULE_SETS
        if appeared and (self._rule_sets is None or rule_sets.digest != self._rule_sets.digest):
            changed.append(rule_sets_path)
        self._rule_sets = rule_sets
        lists_dir = self.conf_dir / TENANT_LISTS_DIR
        present_lists = _scan_files(lists_dir, (LIST_SUFFIX,))
        for name in [name for name in self._lists if name not in present_lists]:
            del self._lists[name]
            changed.append(lists_dir / name)
        for name, stat in sorted(present_lists.items()):
            known_list = self._lists.get(name)
            if known_list is not None and known_list.is_current(stat):
                continue
            list_read = self._refreshed(
                lists_dir / name, stat, known_list, _parse_list_file, scan_started_ns
            )
            if known_list is None or list_read.digest != known_list.digest:
                changed.append(lists_dir / name)
            self._lists[name] = list_read
        tenants_dir = self.conf_dir / TENANTS_DIR
        present = _scan_files(tenants_dir, (".yaml", ".yml"))
        gone = [name for name in self._tenants if name not in present]
        for name in gone:
            del self._tenants[name]
            changed.append(tenants_dir / name)
        files_before = len(self._tenants)
        for name, stat in present.items():
            known = self._tenants.get(name)
            if known is not None and known.is_current(stat):
                continue  # the common case, so no `Path` is built for it
            read = self._refreshed(
                tenants_dir / name, stat, known, self._parse_tenant, scan_started_ns
            )
            if known is None or read.digest != known.digest:
                changed.append(tenants_dir / name)
            self._tenants[name] = read
        if gone or len(self._tenants) != files_before:
            self._order = sorted(self._tenants, key=_file_order)
        self.last_changed = tuple(changed)
        if changed or self._outcome is None:
            try:
                self._outcome = self._assemble(sources, tenants_dir)
            except ConfigError as error:
                self._outcome = error
        if isinstance(self._outcome, ConfigError):
            raise self._outcome.with_traceback(None)
        return self._outcome

    def _parse_tenant(self, path: Path, data: bytes) -> TenantConfig:
        """A tenant file's config; one whose rules (all but its id) another file has too is
        not validated again, and shares that file's frozen rule objects."""
        body = _parse_yaml(path, data)
        tenant_id = body.get("id")
        try:
            content = json.dumps({**body, "id": None}, sort_keys=True)
        except (TypeError, ValueError):
            content = None  # not JSON-like (a date, a set): validated on its own, and refused
        shared = self._rule_sets_by_content.get(content) if content is not None else None
        if shared is not None and isinstance(tenant_id, str) and _is_valid_id(tenant_id):
            return TenantConfig.of_rule_set(tenant_id, shared)
        tenant = validate_model(TenantConfig, body, path, "")
        if content is not None:
            # Bounded by the files there are: content no file has any more is forgotten.
            if len(self._rule_sets_by_content) > 2 * len(self._tenants) + 64:
                self._rule_sets_by_content.clear()
            self._rule_sets_by_content[content] = RuleSet.model_construct(
                sources=tenant.sources,
                quota=tenant.quota,
                retention_ms=tenant.retention_ms,
                query=tenant.query,
            )
        return tenant

    def file_of(self, tenant_id: str) -> Path | None:
        """The file that defines `tenant_id` as of the last `load`, if one does."""
        for name in self._order:
            outcome = self._tenants[name].outcome
            if not isinstance(outcome, ConfigError) and outcome.id == tenant_id:
                return self.conf_dir / TENANTS_DIR / name
        return None

    def _refreshed(
        self,
        path: Path,
        stat: FileStat | None,
        known: _FileRead[OutcomeT] | None,
        parse: Callable[[Path, bytes], OutcomeT],
        scan_started_ns: int,
        missing_means: OutcomeT | None = None,
    ) -> _FileRead[OutcomeT]:
        """The file as it is now: `known` again, with a new stat if only that changed, or the
        file read, and validated if its content digest changed. A missing file is an error,
        or `missing_means` for an optional one."""
        if known is not None and known.is_current(stat):
            return known
        if missing_means is not None and stat is None and not path.exists():
            return _FileRead(stat=None, digest=b"", outcome=missing_means, racy=False)
        racy = stat is not None and stat[1] >= scan_started_ns - RACY_WINDOW_NS
        try:
            data = self._read_bytes(path)
        except FileNotFoundError:
            if missing_means is not None:
                return _FileRead(stat=None, digest=b"", outcome=missing_means, racy=False)
            return _unreadable(ConfigError(path, [("", "file not found")]))
        except OSError as error:
            return _unreadable(ConfigError(path, [("", f"cannot be read: {error}")]))
        digest = hashlib.sha256(data).digest()
        if known is not None and known.digest == digest:
            return replace(known, stat=stat, racy=racy)
        outcome: OutcomeT | ConfigError
        try:
            outcome = parse(path, data)
        except ConfigError as error:
            outcome = error
        return _FileRead(stat=stat, digest=digest, outcome=outcome, racy=racy)

    def _assemble(
        self, sources_read: _FileRead[dict[str, SourceConfig]], tenants_dir: Path
    ) -> TenantRegistry:
        sources_path = self.conf_dir / SOURCES_FILE
        sources = _outcome(sources_read)
        fingerprint = hashlib.sha256(SOURCES_FILE.encode() + b"\0" + sources_read.digest)
        tenants: dict[str, TenantConfig] = {}
        tenant_files: dict[str, str] = {}
        for name in self._order:
            read = self._tenants[name]
            tenant = _outcome(read)
            if tenant.id in tenants:
                first = tenants_dir / tenant_files[tenant.id]
                raise ConfigError(
                    tenants_dir / name,
                    [("id", f"tenant {tenant.id!r} is already defined in {first}")],
                )
            unknown = [source for source in tenant.sources if source not in sources]
            if unknown:
                raise ConfigError(
                    tenants_dir / name,
                    [
                        (
                            f"sources.{source}",
                            f"unknown source; {sources_path} defines {sorted(sources)}",
                        )
                        for source in unknown
                    ],
                )
            tenants[tenant.id] = tenant
            tenant_files[tenant.id] = name
            fingerprint.update(name.encode() + b"\0" + read.digest)
        rule_sets = _outcome(self._rule_sets) if self._rule_sets is not None else {}
        if rule_sets:
            self._check_rule_sets(rule_sets, sources)
        listed = self._merged_lists()
        if not rule_sets and not len(listed):
            return TenantRegistry.build(sources, tenants, fingerprint=fingerprint.hexdigest())
        assert self._rule_sets is not None
        fingerprint.update(b"\0" + RULE_SETS_FILE.encode() + b"\0" + self._rule_sets.digest)
        for list_name, list_read in sorted(self._lists.items()):
            fingerprint.update(b"\0" + list_name.encode() + b"\0" + list_read.digest)
        self._check_rule_sets_named(listed, rule_sets)
        for tenant_id, name in tenant_files.items():
            if tenant_id in listed:
                list_file, line = self.where_listed(tenant_id)
                raise ConfigError(
                    tenants_dir / name,
                    [
                        (
                            "id",
                            f"tenant {tenant_id!r} is also listed in {list_file} (line {line}); "
                            "a tenant is either in a list (a shared rule set) or has a file "
                            "(rules of its own): remove it from one of them",
                        )
                    ],
                )
        return TenantRegistry.build(
            sources,
            tenants,
            fingerprint=fingerprint.hexdigest(),
            rule_sets=rule_sets,
            listed=listed,
        )

    def _check_rule_sets(
        self, rule_sets: Mapping[str, RuleSet], sources: Mapping[str, SourceConfig]
    ) -> None:
        path = self.conf_dir / RULE_SETS_FILE
        problems = [
            (
                f"rule_sets.{name}.sources.{source}",
                f"unknown source; {self.conf_dir / SOURCES_FILE} defines {sorted(sources)}",
            )
            for name, rule_set in rule_sets.items()
            for source in rule_set.sources
            if source not in sources
        ]
        if problems:
            raise ConfigError(path, problems)

    def _merged_lists(self) -> ListedTenants:
        """Every list's rows as one mapping; a tenant in two lists is refused. Checked again
        only when a list changed, not when a tenant file did."""
        reads = sorted(self._lists.items())
        digests = tuple(read.digest for _, read in reads)
        if self._listed is not None and self._listed[0] == digests:
            return self._listed[1]
        lists = [(name, _outcome(read)) for name, read in reads]
        for position, (name, tenant_list) in enumerate(lists):
            for earlier_name, earlier in lists[:position]:
                smaller, larger = sorted((tenant_list.rule_set_of, earlier.rule_set_of), key=len)
                twice = next((tenant for tenant in smaller if tenant in larger), None)
                if twice is not None:
                    lines = self._list_lines(name, [twice])
                    earlier_lines = self._list_lines(earlier_name, [twice])
                    raise ConfigError(
                        self.conf_dir / TENANT_LISTS_DIR / name,
                        [
                            (
                                f"line {lines.get(twice, '?')}: tenant_id",
                                f"tenant {twice!r} is also listed in "
                                f"{self.conf_dir / TENANT_LISTS_DIR / earlier_name} "
                                f"(line {earlier_lines.get(twice, '?')}); list it once",
                            )
                        ],
                    )
        merged = ListedTenants(tuple(tenant_list for _, tenant_list in lists))
        self._listed = (digests, merged)
        return merged

    def _check_rule_sets_named(
        self, listed: ListedTenants, rule_sets: Mapping[str, RuleSet]
    ) -> None:
        unknown = listed.rule_set_names - rule_sets.keys()
        if not unknown:
            return
        rule_sets_path = self.conf_dir / RULE_SETS_FILE
        for name, read in sorted(self._lists.items()):
            named = _outcome(read).rule_set_names & unknown
            if named:
                path = self.conf_dir / TENANT_LISTS_DIR / name
                text = self._list_text(name)
                raise ConfigError(
                    path,
                    [
                        (
                            f"line {first_line_naming(text, rule_set) or '?'}: rule_set",
                            unknown_rule_set_problem(rule_set, rule_sets.keys(), rule_sets_path),
                        )
                        for rule_set in sorted(named)
                    ],
                )

    def where_listed(self, tenant_id: str) -> tuple[Path, int | str]:
        """The list file (and line) that lists `tenant_id`; raise `KeyError` if none does."""
        for name, read in sorted(self._lists.items()):
            if tenant_id in _outcome(read).rule_set_of:
                line = self._list_lines(name, [tenant_id]).get(tenant_id, "?")
                return self.conf_dir / TENANT_LISTS_DIR / name, line
        raise KeyError(tenant_id)

    def _list_text(self, name: str) -> str:
        # Errors only: a valid list keeps no line numbers, so they are found by reading again.
        try:
            return self._read_bytes(self.conf_dir / TENANT_LISTS_DIR / name).decode("utf-8-sig")
        except (OSError, UnicodeDecodeError):
            return ""

    def _list_lines(self, name: str, tenants: list[str]) -> dict[str, int]:
        return first_lines(self._list_text(name), tenants)


def _outcome(read: _FileRead[OutcomeT]) -> OutcomeT:
    if isinstance(read.outcome, ConfigError):
        raise read.outcome.with_traceback(None)
    return read.outcome


def _unreadable(error: ConfigError) -> _FileRead[Any]:
    # The digest of the problem: the same problem on the next scan is no change.
    digest = hashlib.sha256(str(error).encode()).digest()
    return _FileRead(stat=None, digest=digest, outcome=error, racy=False)


def _stat(path: Path) -> FileStat | None:
    try:
        return _file_stat(path.stat())
    except OSError:
        return None


def _file_stat(stat: os.stat_result) -> FileStat:
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def _scan_files(directory: Path, suffixes: tuple[str, ...]) -> dict[str, FileStat | None]:
    """Every file in `directory` named `*<suffix>` with its stat (None: cannot be stat'ed)."""
    found: dict[str, FileStat | None] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(suffixes) or entry.is_dir():
                    continue
                try:
                    found[entry.name] = _file_stat(entry.stat())
                except OSError:
                    # A dangling link, or a file removed since listing: reading it says which.
                    found[entry.name] = None
    except FileNotFoundError:
        pass  # no tenants (or no lists) yet
    return found


def _file_order(name: str) -> tuple[bool, str]:
    # `*.yaml` before `*.yml`, each by name: the order files are checked and fingerprinted in.
    return (name.endswith(".yml"), name)


def _parse_sources(path: Path, data: bytes) -> dict[str, SourceConfig]:
    source_entries = _parse_yaml(path, data).get("sources")
    if not isinstance(source_entries, dict) or not source_entries:
        raise ConfigError(path, [("sources", "must be a mapping of source id to its rules")])
    sources = {
        name: validate_model(SourceConfig, body, path, f"sources.{name}")
        for name, body in source_entries.items()
    }
    bad_ids = [name for name in sources if not _is_valid_id(name)]
    if bad_ids:
        raise ConfigError(path, [(f"sources.{name}", _ID_PROBLEM) for name in bad_ids])
    return sources


def _parse_tenant(path: Path, data: bytes) -> TenantConfig:
    return validate_model(TenantConfig, _parse_yaml(path, data), path, "")


# What a conf dir without `rule_sets.yaml` has: no rule sets (one shared object, so a missing
# file is told apart from an empty one only by identity).
_NO_RULE_SETS: dict[str, RuleSet] = {}


def _parse_rule_sets(path: Path, data: bytes) -> dict[str, RuleSet]:
    entries = _parse_yaml(path, data).get("rule_sets")
    if not isinstance(entries, dict) or not entries:
        raise ConfigError(path, [("rule_sets", "must be a mapping of rule set name to its rules")])
    bad_names = [name for name in entries if not _is_valid_id(name)]
    if bad_names:
        raise ConfigError(path, [(f"rule_sets.{name}", _ID_PROBLEM) for name in bad_names])
    return {
        name: validate_model(RuleSet, body, path, f"rule_sets.{name}")
        for name, body in entries.items()
    }


def _parse_list_file(path: Path, data: bytes) -> TenantList:
    try:
        return parse_tenant_list(data)
    except TenantListError as error:
        raise ConfigError(path, error.problems) from None


_ID_PROBLEM = "must match ^[a-z0-9][a-z0-9_-]{0,62}$ (an id is a path component)"


def _is_valid_id(name: object) -> bool:
    return isinstance(name, str) and re.fullmatch(ID_PATTERN, name) is not None


# libyaml's parser when PyYAML was built with it: several times faster on 100,000 files.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_yaml(path: Path, data: bytes) -> dict[str, Any]:
    try:
        loaded = yaml.load(data.decode("utf-8"), Loader=_YAML_LOADER)
    except UnicodeDecodeError as error:
        raise ConfigError(path, [("", f"not UTF-8 text: {error}")]) from None
    except yaml.YAMLError as error:
        raise ConfigError(path, [("", f"not valid YAML: {error}")]) from None
    if not isinstance(loaded, dict):
        raise ConfigError(path, [("", "must be a YAML mapping")])
    return loaded


def validate_model(model: type[ModelT], data: object, path: Path | str, prefix: str) -> ModelT:
    """`model` from `data`, or a `ConfigError` naming `path` and each field under `prefix`."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = []
        for detail in error.errors():
            location = ".".join(
                str(part)
                for part in (prefix, *detail["loc"])
                # pydantic names the chosen window kind in the path; the YAML has no such key.
                if part != "" and part not in WINDOW_KINDS
            )
            problems.append((location, problem_message(model, detail)))
        raise ConfigError(path, problems) from None

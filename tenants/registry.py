"""The validated, immutable registry of sources and tenants (`conf_reader` builds it from
`conf/`): every (tenant, source) key's rules, its route built only when first resolved, and
what a config change adds.

Every problem is reported as a `ConfigError` naming the file, the field and what is wrong, so an
operator can fix a tenant file without reading a stack trace.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from tenants.models import (
    EventTimeSpec,
    Quota,
    RuleSet,
    SourceConfig,
    TenantConfig,
    WindowRules,
    rules_id,
)
from tenants.tenant_lists import (
    ListedTenants,
    SourceIdIndex,
    TenantDirectory,
)

ModelT = TypeVar("ModelT", bound=BaseModel)

SOURCES_FILE = "sources.yaml"
TENANTS_DIR = "tenants"


class ConfigError(ValueError):
    """A config file that cannot be accepted: which file, which field, what is wrong."""

    def __init__(self, file: Path | str, problems: Iterable[tuple[str, str]]) -> None:
        self.file = str(file)
        self.problems = list(problems)
        lines = [
            f"{self.file}: {field_path or '(file)'}: {problem}"
            for field_path, problem in self.problems
        ]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class ResolvedSource:
    """What the pipeline needs to accept a record of a (tenant, source) key. One object serves
    every key of a source whose rules are the same (`TenantRegistry.resolve`)."""

    event_time: EventTimeSpec
    rules: WindowRules
    rules_id: str
    """`rules_id(rules)`, computed once per rules and process rather than once per batch."""


@dataclass(frozen=True)
class TenantRegistry:
    """All tenants and sources; `fingerprint` changes whenever any file's content does."""

    sources: Mapping[str, SourceConfig]
    tenants: Mapping[str, TenantConfig]
    fingerprint: str = ""
    _source_rules: Mapping[str, WindowRules] = field(default_factory=dict, repr=False)
    _source_rules_ids: Mapping[str, str] = field(default_factory=dict, repr=False)
    _index: SourceIdIndex | None = field(default=None, repr=False, compare=False)
    """`tenants`, when it can answer for a tenant without building its config. Checked once:
    `isinstance` against a protocol costs microseconds, paid per new key otherwise."""
    # Routes are built on first use, not for all 100,000 tenants up front: every executor
    # process loads the registry, and a batch touches only the tenants in it. Filling this memo
    # never changes what `resolve` answers, so the registry stays a value.
    _routes: dict[tuple[str, str], ResolvedSource] = field(
        default_factory=dict, repr=False, compare=False
    )
    # The memo's values, one per (source, rules id): an object per key would be an object per
    # key that every full collection of Python's cycle collector walks, and PySpark's worker
    # runs one after each task (100,000 keys' routes: 65-90 ms a collection, half of the
    # workers' CPU at 100,000 tenants). A (tenant, source) tuple of strings is not walked.
    _shared_routes: dict[tuple[str, str], ResolvedSource] = field(
        default_factory=dict, repr=False, compare=False
    )
    # The rules of a (rule set, source), built once for all the tenants a list names it for.
    _rule_set_rules: dict[tuple[str, str], tuple[WindowRules, str]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        sources: Mapping[str, SourceConfig],
        tenants: Mapping[str, TenantConfig],
        fingerprint: str = "",
        rule_sets: Mapping[str, RuleSet] | None = None,
        listed: Mapping[str, str] | None = None,
    ) -> TenantRegistry:
        """The registry of `sources` and `tenants`, and of the tenants `listed` (id -> the name
        of their rule set in `rule_sets`) when there are rule sets or lists."""
        if rule_sets or listed:
            tenants = TenantDirectory(own=tenants, listed=listed or {}, rule_sets=rule_sets or {})
        source_rules = {name: source.rules() for name, source in sources.items()}
        return cls(
            sources=dict(sources),
            tenants=tenants,
            fingerprint=fingerprint,
            _source_rules=source_rules,
            _source_rules_ids={name: rules_id(rules) for name, rules in source_rules.items()},
            _index=tenants if isinstance(tenants, SourceIdIndex) else None,
        )

    def resolve(self, tenant: str, source: str) -> ResolvedSource | None:
        route = self._routes.get((tenant, source))
        if route is None:
            # Misses are not remembered: record fields are untrusted input, so remembering
            # unknown names would let them grow the memo without bound.
            route = self._route(tenant, source)
            if route is not None:
                self._routes[(tenant, source)] = route
        return route

    def knows_tenant(self, tenant: str) -> bool:
        return tenant in self.tenants

    def source_ids(self, tenant: str) -> Collection[str]:
        """The sources `tenant` (which must be known) sends, without validating its config
        when the tenants come from a snapshot: a diff of 100,000 tenants' keys stays cheap."""
        if self._index is not None:
            return self._index.source_ids(tenant)
        return self.tenants[tenant].sources.keys()

    def configured_keys(self) -> Iterator[tuple[str, str]]:
        """Every (tenant, source) key, by tenant; as cheap as `source_ids`."""
        index = self._index
        for tenant in self.tenants:
            sources = (
                index.source_ids(tenant) if index is not None else self.tenants[tenant].sources
            )
            for source in sources:
                yield tenant, source

    def keys_added_since(self, previous: TenantRegistry | None) -> Iterator[tuple[str, str]]:
        """The (tenant, source) keys this registry configures and `previous` does not (None:
        every key), without a set of all keys: at a million listed tenants that set costs
        hundreds of MB. A listed tenant that names the same rule set as before costs a lookup."""
        if previous is None:
            yield from self.configured_keys()
            return
        if previous.fingerprint and previous.fingerprint == self.fingerprint:
            return
        before = previous.tenants
        before_listed = before if isinstance(before, TenantDirectory) else None
        own: Mapping[str, TenantConfig] = self.tenants
        directory = self.tenants
        if isinstance(directory, TenantDirectory):
            own = directory.own
            gained: dict[tuple[str, str], tuple[str, ...]] = {}
            listed = directory.listed
            rows = listed.files if isinstance(listed, ListedTenants) else (listed,)
            rule_set_before = before_listed.rule_set_of if before_listed else _no_rule_set
            for tenant, name in itertools.chain.from_iterable(row.items() for row in rows):
                name_before = rule_set_before(tenant)
                if name_before is None:
                    yield from self._keys_new_to(previous, tenant)
                    continue
                new_sources = gained.get((name, name_before))
                if new_sources is None:
                    assert before_listed is not None
                    had = before_listed.rule_sets[name_before].sources
                    new_sources = tuple(
                        source for source in directory.rule_sets[name].sources if source not in had
                    )
                    gained[(name, name_before)] = new_sources
                for source in new_sources:
                    yield tenant, source
        for tenant in own:
            yield from self._keys_new_to(previous, tenant)

    def _keys_new_to(self, previous: TenantRegistry, tenant: str) -> Iterator[tuple[str, str]]:
        had: Collection[str] = previous.source_ids(tenant) if previous.knows_tenant(tenant) else ()
        for source in self.source_ids(tenant):
            if source not in had:
                yield tenant, source

    def quota_of(self, tenant: str) -> Quota | None:
        """The tenant's own quota; None for an unknown tenant or one without a quota (the
        stream's default applies). As cheap as `source_ids` for a tenant without one."""
        if tenant not in self.tenants:
            return None
        if self._index is not None and not self._index.sets_quota(tenant):
            return None
        return self.tenants[tenant].quota

    @functools.cached_property
    def sets_any_quota(self) -> bool:
        """Whether any tenant has a quota of its own: looked at once per registry, so a reader
        with no quota to apply skips admission without a look per tenant."""
        index = self._index
        if isinstance(index, TenantDirectory):
            return index.any_sets_quota()
        if index is not None:
            return any(index.sets_quota(tenant) for tenant in self.tenants)
        return any(config.quota is not None for config in self.tenants.values())

    def notifies_anyone(self) -> bool:
        """Whether any key has an endpoint to tell about its panes; builds the config only of
        tenants that override a source's rules, and looks at each rule set in use once."""
        index = self._index
        keys: Iterable[tuple[str, str]] = self.configured_keys()
        if isinstance(index, TenantDirectory):
            for name in index.rule_sets_in_use():
                rule_set = index.rule_sets[name]
                for source_name, overrides in rule_set.sources.items():
                    source = self.sources.get(source_name)
                    if source is not None and source.notify_targets(overrides):
                        return True
            keys = ((tenant, source) for tenant in index.own for source in index.source_ids(tenant))
        for tenant, source_name in keys:
            source = self.sources.get(source_name)
            if source is None:
                continue
            if index is not None and index.overrides_nothing(tenant, source_name):
                targets = source.notify
            else:
                targets = source.notify_targets(self.tenants[tenant].sources[source_name])
            if targets:
                return True
        return False

    def configures(self, tenant: str, source: str) -> bool:
        """Whether `resolve(tenant, source)` finds a route, at the cost of a lookup."""
        return tenant in self.tenants and source in self.source_ids(tenant)

    def _route(self, tenant: str, source: str) -> ResolvedSource | None:
        source_rules = self._source_rules.get(source)
        if source_rules is None or not self.configures(tenant, source):
            return None
        index = self._index
        if index is not None and index.overrides_nothing(tenant, source):
            # No tenant config to build: validating it was most of routing a new key, which
            # every executor process does for every key after each config change.
            rules, rules_id_ = source_rules, self._source_rules_ids[source]
        elif isinstance(index, TenantDirectory) and (name := index.rule_set_of(tenant)):
            # Every tenant of a rule set shares its rules: built and hashed once per process.
            shared = self._rule_set_rules.get((name, source))
            if shared is None:
                rules = source_rules.with_overrides(index.rule_sets[name].sources[source])
                shared = self._rule_set_rules[(name, source)] = (rules, rules_id(rules))
            rules, rules_id_ = shared
        else:
            rules = source_rules.with_overrides(self.tenants[tenant].sources[source])
            rules_id_ = self._source_rules_ids[source] if rules is source_rules else rules_id(rules)
        route = self._shared_routes.get((source, rules_id_))
        if route is None:
            route = ResolvedSource(
                event_time=self.sources[source].event_time, rules=rules, rules_id=rules_id_
            )
            self._shared_routes[(source, rules_id_)] = route
        return route


def _no_rule_set(tenant: str) -> None:
    return None

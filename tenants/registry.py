"""Load `conf/sources.yaml` and `conf/tenants/*.yaml` into one validated, immutable registry.

Every problem is reported as a `ConfigError` naming the file, the field and what is wrong, so an
operator can fix a tenant file without reading a stack trace.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tenants.models import ID_PATTERN, EventTimeSpec, SourceConfig, TenantConfig, WindowRules

ModelT = TypeVar("ModelT", bound=BaseModel)

SOURCES_FILE = "sources.yaml"
WINDOW_KINDS = {"tumbling", "sliding", "session"}
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
    """What the pipeline needs to accept a record of one (tenant, source) key."""

    tenant: str
    source: str
    event_time: EventTimeSpec
    rules: WindowRules


@dataclass(frozen=True)
class TenantRegistry:
    """All tenants and sources; `fingerprint` changes whenever any file's content does."""

    sources: Mapping[str, SourceConfig]
    tenants: Mapping[str, TenantConfig]
    fingerprint: str = ""
    _routes: Mapping[tuple[str, str], ResolvedSource] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls,
        sources: Mapping[str, SourceConfig],
        tenants: Mapping[str, TenantConfig],
        fingerprint: str = "",
    ) -> TenantRegistry:
        routes = {
            (tenant.id, source_name): ResolvedSource(
                tenant=tenant.id,
                source=source_name,
                event_time=sources[source_name].event_time,
                rules=sources[source_name].rules().with_overrides(overrides),
            )
            for tenant in tenants.values()
            for source_name, overrides in tenant.sources.items()
        }
        return cls(
            sources=dict(sources), tenants=dict(tenants), fingerprint=fingerprint, _routes=routes
        )

    def resolve(self, tenant: str, source: str) -> ResolvedSource | None:
        return self._routes.get((tenant, source))

    def knows_tenant(self, tenant: str) -> bool:
        return tenant in self.tenants


def load_registry(conf_dir: Path) -> TenantRegistry:
    """Read and validate the whole config directory; raise `ConfigError` on the first bad file."""
    sources_path = conf_dir / SOURCES_FILE
    tenant_paths = sorted((conf_dir / TENANTS_DIR).glob("*.yaml")) + sorted(
        (conf_dir / TENANTS_DIR).glob("*.yml")
    )
    digest = hashlib.sha256()
    for path in [sources_path, *tenant_paths]:
        if path.exists():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")

    raw_sources = _read_yaml(sources_path)
    source_entries = raw_sources.get("sources")
    if not isinstance(source_entries, dict) or not source_entries:
        raise ConfigError(
            sources_path, [("sources", "must be a mapping of source id to its rules")]
        )
    sources = {
        name: _validate(SourceConfig, body, sources_path, f"sources.{name}")
        for name, body in source_entries.items()
    }
    bad_ids = [name for name in sources if not _is_valid_id(name)]
    if bad_ids:
        raise ConfigError(sources_path, [(f"sources.{name}", _ID_PROBLEM) for name in bad_ids])

    tenants: dict[str, TenantConfig] = {}
    tenant_files: dict[str, Path] = {}
    for path in tenant_paths:
        tenant = _validate(TenantConfig, _read_yaml(path), path, "")
        if tenant.id in tenants:
            raise ConfigError(
                path,
                [("id", f"tenant {tenant.id!r} is already defined in {tenant_files[tenant.id]}")],
            )
        unknown = [name for name in tenant.sources if name not in sources]
        if unknown:
            raise ConfigError(
                path,
                [
                    (f"sources.{name}", f"unknown source; {sources_path} defines {sorted(sources)}")
                    for name in unknown
                ],
            )
        tenants[tenant.id] = tenant
        tenant_files[tenant.id] = path
    return TenantRegistry.build(sources, tenants, fingerprint=digest.hexdigest())


_ID_PROBLEM = "must match ^[a-z0-9][a-z0-9_-]{0,62}$ (an id is a path component)"


def _is_valid_id(name: object) -> bool:
    return isinstance(name, str) and re.fullmatch(ID_PATTERN, name) is not None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, [("", "file not found")]) from None
    except UnicodeDecodeError as error:
        raise ConfigError(path, [("", f"not UTF-8 text: {error}")]) from None
    except OSError as error:
        raise ConfigError(path, [("", f"cannot be read: {error}")]) from None
    except yaml.YAMLError as error:
        raise ConfigError(path, [("", f"not valid YAML: {error}")]) from None
    if not isinstance(loaded, dict):
        raise ConfigError(path, [("", "must be a YAML mapping")])
    return loaded


def _validate(model: type[ModelT], data: object, path: Path, prefix: str) -> ModelT:
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
            problems.append((location, detail["msg"]))
        raise ConfigError(path, problems) from None

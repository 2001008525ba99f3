"""`tenants offboard`: take a tenant's file out of the config, keeping a copy beside it.

The file moves to `<conf>/offboarded/`, which the registry never reads (it reads
`sources.yaml` and `tenants/*.yaml` only), so the running stream sees the tenant gone at its
next micro-batch, closes its open windows and quarantines its later records. Moving the file
back onboards the tenant again, with fresh state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tenants.conf_reader import ConfReader
from tenants.registry import ConfigError

OFFBOARDED_DIR = "offboarded"


@dataclass(frozen=True)
class Offboarded:
    tenant_id: str
    sources: tuple[str, ...]
    moved_from: Path
    moved_to: Path


def offboard_tenant(conf_dir: Path, tenant_id: str, now: datetime | None = None) -> Offboarded:
    """Move `tenant_id`'s file out of `conf_dir/tenants/`; raise `ConfigError` if the config is
    invalid now or does not define the tenant, so nothing is moved then."""
    reader = ConfReader(conf_dir)
    registry = reader.load()
    path = reader.file_of(tenant_id)
    if path is None and tenant_id in registry.tenants:
        list_file, line = reader.where_listed(tenant_id)
        raise ConfigError(
            list_file,
            [
                (
                    f"line {line}: tenant_id",
                    f"tenant {tenant_id!r} is listed here, not in a file of its own: delete its "
                    "row to offboard it (the stream sees the change at its next recheck)",
                )
            ],
        )
    if path is None:
        known = ", ".join(sorted(registry.tenants)[:10]) or "none"
        raise ConfigError(
            conf_dir / "tenants",
            [("id", f"no tenant {tenant_id!r} is configured (known: {known})")],
        )
    sources = tuple(sorted(registry.tenants[tenant_id].sources))
    archive = conf_dir / OFFBOARDED_DIR
    archive.mkdir(exist_ok=True)
    # Stamped, so offboarding a tenant a second time keeps the first copy too.
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    target = archive / f"{path.stem}.{stamp}{path.suffix}"
    path.rename(target)
    try:
        reader.load()  # what is left must be a valid config, as at any other change
    except ConfigError:
        target.rename(path)
        raise
    return Offboarded(tenant_id, sources, path, target)

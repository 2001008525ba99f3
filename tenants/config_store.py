"""Live onboarding without losing determinism: published, immutable snapshots of the registry.

The driver validates `conf/` between micro-batches and, when it changed and is valid, publishes
a snapshot stamped "effective from" the current time. Every micro-batch reads the snapshot in
force at its own batch timestamp (which Spark keeps in its offset log), so a batch replayed
after a restart sees exactly the config it saw the first time, and executors never read a
half-edited `conf/`. An invalid change is logged and ignored: the last good snapshot stays.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyarrow import fs

from tenants.models import SourceConfig, TenantConfig
from tenants.registry import SOURCES_FILE, TENANTS_DIR, ConfigError, TenantRegistry, load_registry

log = logging.getLogger(__name__)


def registry_to_json(registry: TenantRegistry) -> str:
    return json.dumps(
        {
            "fingerprint": registry.fingerprint,
            "sources": {n: s.model_dump(mode="json") for n, s in registry.sources.items()},
            "tenants": {n: t.model_dump(mode="json") for n, t in registry.tenants.items()},
        },
        sort_keys=True,
    )


def registry_from_json(text: str) -> TenantRegistry:
    data: dict[str, Any] = json.loads(text)
    return TenantRegistry.build(
        {n: SourceConfig.model_validate(s) for n, s in data["sources"].items()},
        {n: TenantConfig.model_validate(t) for n, t in data["tenants"].items()},
        fingerprint=data["fingerprint"],
    )


@dataclass
class ConfigSnapshots:
    """Snapshots named `<effective_from_ms>-<fingerprint>.json` under `root` (local or S3 URI).

    Picklable: executors get a copy and cache what they read (snapshots never change).
    """

    root: str
    _cache: dict[str, TenantRegistry] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "_cache": {}}

    def _filesystem(self) -> tuple[fs.FileSystem, str]:
        filesystem, path = fs.FileSystem.from_uri(
            self.root if "://" in self.root else str(Path(self.root).resolve())
        )
        return filesystem, path

    def _names(self) -> list[tuple[int, str]]:
        filesystem, path = self._filesystem()
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
        named = []
        for info in infos:
            stem = info.base_name.removesuffix(".json")
            if info.base_name.endswith(".json") and "-" in stem:
                named.append((int(stem.split("-", 1)[0]), info.base_name))
        return sorted(named)

    def latest_fingerprint(self) -> str | None:
        names = self._names()
        return names[-1][1].removesuffix(".json").split("-", 1)[1] if names else None

    def publish(self, registry: TenantRegistry, effective_from_ms: int) -> bool:
        """Publish `registry` unless it is already the newest snapshot; True if published."""
        if self.latest_fingerprint() == registry.fingerprint:
            return False
        filesystem, path = self._filesystem()
        filesystem.create_dir(path, recursive=True)
        name = f"{effective_from_ms}-{registry.fingerprint}.json"
        # Write then move, so a reader never sees a partial snapshot.
        with filesystem.open_output_stream(f"{path}/.{name}.tmp") as out:
            out.write(registry_to_json(registry).encode())
        filesystem.move(f"{path}/.{name}.tmp", f"{path}/{name}")
        return True

    def registry_at(self, batch_timestamp_ms: int) -> TenantRegistry:
        """The snapshot in force for a micro-batch with this timestamp."""
        in_force = [name for effective, name in self._names() if effective <= batch_timestamp_ms]
        if not in_force:
            raise LookupError(
                f"no tenant config snapshot in {self.root} before {batch_timestamp_ms}"
            )
        name = in_force[-1]
        if name not in self._cache:
            filesystem, path = self._filesystem()
            with filesystem.open_input_stream(f"{path}/{name}") as stream:
                self._cache[name] = registry_from_json(stream.read().decode())
        return self._cache[name]


@dataclass
class ConfigWatcher:
    """Driver side: re-read `conf/` when it changed; publish it if valid, else keep the last."""

    conf_dir: Path
    snapshots: ConfigSnapshots
    _last_seen: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refresh(self, now_ms: int) -> TenantRegistry | None:
        """Publish a changed, valid config as effective from `now_ms`; return it if published."""
        try:
            with self._lock:
                return self._refresh(now_ms)
        except Exception:
            # A config watcher must never stop the stream: the last good config stays.
            log.exception("tenant config could not be read; the stream keeps its last good config")
            return None

    def watch(
        self, stopping: threading.Event, interval_s: float, clock_ms: Callable[[], int]
    ) -> threading.Thread:
        """Poll in a thread until `stopping` is set, so a change is in force from the next
        micro-batch rather than from the one after it. The caller joins the thread."""

        def poll() -> None:
            while not stopping.wait(interval_s):
                self.refresh(clock_ms())

        thread = threading.Thread(target=poll, name="tenant-config-watcher", daemon=True)
        thread.start()
        return thread

    def _refresh(self, now_ms: int) -> TenantRegistry | None:
        seen = _directory_digest(self.conf_dir)
        if seen == self._last_seen:
            return None
        self._last_seen = seen
        try:
            registry = load_registry(self.conf_dir)
        except ConfigError as error:
            log.error(
                "tenant config change refused; the stream keeps its last good config:\n%s", error
            )
            return None
        if self.snapshots.publish(registry, now_ms):
            log.info("tenant config %s in force from %d", registry.fingerprint[:12], now_ms)
            return registry
        return None


def _directory_digest(conf_dir: Path) -> str:
    digest = hashlib.sha256()
    files = [conf_dir / SOURCES_FILE, *sorted((conf_dir / TENANTS_DIR).glob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()

"""Refuse a checkpoint that belongs to another stream, before the query touches it.

Spark would happily resume a checkpoint written for another topic or stream name and silently
reprocess or skip data. Each checkpoint therefore records which stream it belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

IDENTITY_FILE = "tenant_windows_stream.json"


class CheckpointMismatchError(RuntimeError):
    """The checkpoint was written by another stream, or is damaged."""


class StreamIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_name: str
    topic: str
    lake_root: str
    state_layout: int = 1
    """How window state is kept; checkpoints written before this field existed are layout 1."""
    state_buckets: int | None = None
    """How many hash buckets of keys the state has (layout 2 on)."""


def check_checkpoint(checkpoint_dir: str, identity: StreamIdentity) -> None:
    """Raise unless the checkpoint is new or belongs to `identity`; writes nothing."""
    folder = Path(checkpoint_dir)
    path = folder / IDENTITY_FILE
    if not path.exists():
        if (folder / "offsets").exists():
            raise CheckpointMismatchError(
                f"{folder} holds a Spark checkpoint without {IDENTITY_FILE}: it was not written "
                "by tenant-windows. Use a new --checkpoint-dir."
            )
        return
    try:
        recorded = StreamIdentity.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as error:
        raise CheckpointMismatchError(
            f"{path} is damaged ({error}); refusing to resume from it"
        ) from None
    differences = ", ".join(
        f"{name} {getattr(recorded, name)!r} (this run: {getattr(identity, name)!r})"
        for name in ("stream_name", "topic", "lake_root")
        if getattr(recorded, name) != getattr(identity, name)
    )
    if differences:
        raise CheckpointMismatchError(
            f"checkpoint {folder} belongs to another stream: {differences}. Resuming it would "
            "reprocess or skip records. Use this stream's own --checkpoint-dir, or the settings "
            "it was written with."
        )
    if recorded.state_layout != identity.state_layout:
        raise CheckpointMismatchError(
            f"checkpoint {folder} keeps its window state in layout {recorded.state_layout}; this "
            f"version reads layout {identity.state_layout} only and would misread it. Keep "
            "running the version that wrote it, or stop it and reprocess with this version into "
            "a new checkpoint and lake (docs/operations.md, 'Reprocess from an offset')."
        )
    if recorded.state_buckets != identity.state_buckets:
        raise CheckpointMismatchError(
            f"checkpoint {folder} keeps its state in {recorded.state_buckets} buckets; this run "
            f"asks for {identity.state_buckets}. The number is frozen in the checkpoint: set "
            f"stream.state_buckets to {recorded.state_buckets}, or use a new --checkpoint-dir."
        )


def claim_checkpoint(checkpoint_dir: str, identity: StreamIdentity) -> None:
    """Record `identity` in a new checkpoint, or check it against the one recorded there."""
    check_checkpoint(checkpoint_dir, identity)
    path = Path(checkpoint_dir) / IDENTITY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(identity.model_dump_json(indent=2) + "\n")

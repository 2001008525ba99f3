"""Refuse a checkpoint that belongs to another stream, before the query touches it.

Spark would happily resume a checkpoint written for another topic or stream name and silently
reprocess or skip data. Each checkpoint therefore records which stream it belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

IDENTITY_FILE = "tenant_windows_stream.json"


NEW_CHECKPOINT_STATE_BUCKETS = 16
"""The buckets of a new checkpoint's state when `stream.state_buckets` is unset. Each bucket is
one call of the state function per batch, which costs its fixed ~7 ms of Python however few keys
it holds; 16 is 4 per default shuffle partition."""


NEW_CHECKPOINT_STATE_LAYOUT = 3
"""The state layout a new checkpoint is written in (`streaming.state.state_layouts`)."""
READABLE_STATE_LAYOUTS = frozenset({2, 3})
"""The state layouts a checkpoint may hold for this version to resume it in its own. Layout 1
(a state row per key, before hash buckets) is not among them."""


class CheckpointMismatchError(RuntimeError):
    """The checkpoint was written by another stream, or is damaged."""


class StreamIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_name: str
    topic: str
    lake_root: str
    state_layout: int = 1
    """How window state is kept; checkpoints written before this field existed are layout 1.
    Asked for: the layout of a new checkpoint; an existing one keeps its own if this version
    reads it (`READABLE_STATE_LAYOUTS`)."""
    state_buckets: int | None = None
    """How many hash buckets of keys the state has (layout 2 on). Asked for: None takes the
    checkpoint's, or `NEW_CHECKPOINT_STATE_BUCKETS` for a new one."""
    balanced_for_tasks: int | None = None
    """The stateful tasks the bucket numbers are balanced across (`bucket_placement`); None:
    numbered by slot, as checkpoints written before this field existed are."""


def check_checkpoint(checkpoint_dir: str, identity: StreamIdentity) -> StreamIdentity:
    """Raise unless the checkpoint is new or belongs to `identity`; writes nothing. The identity
    the stream runs with: `identity` for a new checkpoint, otherwise the recorded one, whose
    buckets and their placement the state was written in."""
    folder = Path(checkpoint_dir)
    path = folder / IDENTITY_FILE
    if not path.exists():
        if (folder / "offsets").exists():
            raise CheckpointMismatchError(
                f"{folder} holds a Spark checkpoint without {IDENTITY_FILE}: it was not written "
                "by tenant-windows. Use a new --checkpoint-dir."
            )
        if identity.state_buckets is None:
            return identity.model_copy(update={"state_buckets": NEW_CHECKPOINT_STATE_BUCKETS})
        return identity
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
    if recorded.state_layout not in READABLE_STATE_LAYOUTS:
        readable = " and ".join(map(str, sorted(READABLE_STATE_LAYOUTS)))
        raise CheckpointMismatchError(
            f"checkpoint {folder} keeps its window state in layout {recorded.state_layout}; this "
            f"version reads layouts {readable} only and would misread it. Keep "
            "running the version that wrote it, or stop it and reprocess with this version into "
            "a new checkpoint and lake (docs/operations.md, 'Reprocess from an offset')."
        )
    if identity.state_buckets not in (None, recorded.state_buckets):
        raise CheckpointMismatchError(
            f"checkpoint {folder} keeps its state in {recorded.state_buckets} buckets; this run "
            f"asks for {identity.state_buckets}. The number is frozen in the checkpoint: set "
            f"stream.state_buckets to {recorded.state_buckets} (or leave it unset), or use a new "
            "--checkpoint-dir."
        )
    return recorded


def claim_checkpoint(checkpoint_dir: str, identity: StreamIdentity) -> StreamIdentity:
    """Record `identity` in a new checkpoint, or check it against the one recorded there; the
    identity the stream runs with (`check_checkpoint`)."""
    in_force = check_checkpoint(checkpoint_dir, identity)
    path = Path(checkpoint_dir) / IDENTITY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(in_force.model_dump_json(indent=2) + "\n")
    return in_force

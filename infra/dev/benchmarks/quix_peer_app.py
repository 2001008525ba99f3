"""The scale benchmark's peer: per-(tenant, source) tumbling event-time window counts in
quixstreams, over a preloaded topic, stopping when it has consumed every record.

Run by `quix_peer.run_peer` in the peer's own venv (quixstreams pins confluent-kafka and
pydantic below this project's pins), so it imports the standard library and quixstreams only,
never the project. Its figures are one JSON object on stdout's last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import datetime
from typing import Any


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sources: dict[str, dict[str, Any]] = json.loads(args.sources)
    from quixstreams import Application  # the peer venv only

    # When each chunk's last record had been processed: chunks of `--chunk` records (the
    # stream's `maxOffsetsPerTrigger`), so the parent can leave out the first as warm-up the way
    # the other stages leave out their first batch.
    times: list[float] = []
    consumed = 0
    late = 0
    windows = 0

    def processed(_topic: str, _partition: int, _offset: int) -> None:
        # Called after a message went through every branch: a record is counted once it has
        # been windowed, and the run stops at the preloaded total.
        nonlocal consumed
        consumed += 1
        if consumed % args.chunk == 0 or consumed == args.records:
            times.append(time.monotonic())
        if consumed >= args.records:
            app.stop()

    started = time.monotonic()
    app = Application(
        broker_address=args.broker,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel="WARNING",
        on_message_processed=processed,
    )
    topic = app.topic(
        args.topic, value_deserializer="json", timestamp_extractor=_event_time_extractor(sources)
    )
    records = app.dataframe(topic)
    for name, source in sources.items():

        def too_late(*_: Any) -> bool:
            nonlocal late
            late += 1
            return False  # counted here; quixstreams would log each one

        def emitted(_window: Any) -> None:
            nonlocal windows
            windows += 1

        # The Kafka key is the tenant, so within one source's branch the key is the
        # (tenant, source) the product windows by: no `group_by`, which would send every record
        # through a repartition topic. Each source has its own window size and grace.
        branch = records.filter(lambda value, name=name: value.get("source") == name)
        (
            branch.tumbling_window(
                duration_ms=source["size_ms"],
                # The product takes a record until its key's watermark (newest event time less
                # `out_of_orderness`) passes the window's end plus `allowed_lateness`; quixstreams
                # until the newest event time passes the end plus `grace_ms`. Their sum keeps
                # the same records. (quixstreams' newest time is its partition's, not the key's.)
                grace_ms=source["out_of_orderness_ms"] + source["allowed_lateness_ms"],
                name=f"count-{name}",
                on_late=too_late,
            )
            .count()
            # `.final()`: one result per window when it closes, as the built-in stage's append
            # mode and the product's on-time pane. `.current()` would emit a result per record,
            # work neither the product nor the built-in stage does.
            .final()
            .update(emitted)
        )

    def watchdog() -> None:
        # A bounded run: stop even if records are missing (the parent then reports a failure).
        if not done.wait(args.timeout_s):
            app.stop()

    done = threading.Event()
    threading.Thread(target=watchdog, name="peer-timeout", daemon=True).start()
    run_started = time.monotonic()
    try:
        app.run()
    finally:
        done.set()
    stopped = time.monotonic()
    print(
        json.dumps(
            {
                "records": consumed,
                "late_dropped": late,
                "windows_emitted": windows,
                "seconds": stopped - started,
                "run_started": run_started - started,
                "chunk_ends": [t - started for t in times],
                "close_s": stopped - times[-1] if times else None,
            }
        )
    )
    return 0 if consumed >= args.records else 1


def _event_time_extractor(sources: dict[str, dict[str, Any]]) -> Any:
    """Event time in epoch ms from where the record's source keeps it, as the product reads it."""
    paths = {name: (s["field"].split("."), s["format"]) for name, s in sources.items()}

    def extract(value: Any, _headers: Any, timestamp: int, _kind: Any) -> int:
        path, time_format = paths[value["source"]]
        node = value
        for part in path:
            node = node[part]
        if time_format == "iso8601":
            return int(datetime.fromisoformat(node).timestamp() * 1000)
        if time_format == "epoch_s":
            return int(node * 1000)
        return int(node)

    return extract


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--sources", required=True, help="JSON: per source, its window rules")
    return parser


if __name__ == "__main__":
    sys.exit(main())

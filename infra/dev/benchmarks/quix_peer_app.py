"""The scale benchmark's peer: quixstreams doing the product's job over a preloaded topic: every
record and every final per-(tenant, source) tumbling event-time window count written to Parquet
through quixstreams' own file sink.

It stops when it has consumed `--records` records, or when its parent asks, which is how the
processes of one consumer group stop once their sum is complete; a stop commits, so the sinks
write what they hold. While it runs it writes how many records it has
windowed to `--progress-file`; the parent sums the group's files and, once the group has every
record, creates each process's `--stop-file`.

Run by `quix_peer.run_peer` in the peer's own venv (quixstreams pins confluent-kafka and
pydantic below this project's pins), so it imports the standard library and quixstreams only,
never the project. Its figures are one JSON object on stdout's last line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sources: dict[str, dict[str, Any]] = json.loads(args.sources)
    from quixstreams import Application  # the peer venv only
    from quixstreams.sinks.community.file.local import LocalFileSink

    # Wall-clock time (comparable across the processes of one group) at every `--mark-every`
    # records, so the parent can cut the group's records into chunks of the stream's
    # `maxOffsetsPerTrigger` and leave out the first as the other stages leave out their first
    # batch.
    marks: list[float] = []
    consumed = 0
    last_record_at: float | None = None
    late = 0
    windows = 0
    progress = Path(args.progress_file)

    def processed(_topic: str, _partition: int, _offset: int) -> None:
        # Called after a message went through every branch: a record is counted once it has
        # been windowed and handed to the sinks.
        nonlocal consumed, last_record_at
        consumed += 1
        last_record_at = time.time()
        if consumed % args.mark_every == 0:
            marks.append(last_record_at)
            progress.write_text(str(consumed))
        if consumed >= args.records:
            app.stop()

    started = time.time()
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
    # Every record as the product's `events` table keeps it, in Parquet files of its own.
    records.sink(LocalFileSink(directory="records", format="parquet"))
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
            # Every final window, as the product's `windows` table keeps it.
            .sink(LocalFileSink(directory=f"windows_{_safe(name)}", format="parquet"))
        )

    stop_file = Path(args.stop_file)

    def stopper() -> None:
        # Stops the Application when the parent asks (its stop file exists: the group has
        # windowed every record) or at the timeout, which bounds the run (the parent then
        # reports missing records). Asked again until `run` returns: a stop asked before `run`
        # started would be forgotten by it.
        deadline = time.monotonic() + args.timeout_s
        while not done.wait(0.1):
            if stop_file.exists() or time.monotonic() > deadline:
                app.stop()

    done = threading.Event()
    threading.Thread(target=stopper, name="peer-stopper", daemon=True).start()
    run_started = time.time()
    try:
        app.run()
    finally:
        done.set()
    stopped = time.time()
    progress.write_text(str(consumed))
    print(
        json.dumps(
            {
                "records": consumed,
                "late_dropped": late,
                "windows_emitted": windows,
                "started": started,
                "run_started": run_started,
                "marks": marks,
                "last_record_at": last_record_at,
                "stopped": stopped,
            }
        )
    )
    return 0


def _safe(name: str) -> str:
    """A source name as a directory quixstreams' file sink accepts (letters, digits, `._`)."""
    return re.sub(r"[^a-zA-Z0-9._]", "_", name)


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
    parser.add_argument("--progress-file", required=True)
    parser.add_argument("--mark-every", type=int, required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--sources", required=True, help="JSON: per source, its window rules")
    return parser


if __name__ == "__main__":
    sys.exit(main())

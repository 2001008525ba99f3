"""A standby's rehearsal: the stream's query run once on scratch locations before the lease.

A standby holds a started JVM, a planned query and Python workers, yet its takeover's first
batch still ran cold: Spark loads and compiles the classes of the Kafka Data Source, the
stateful stage, its state store and the sink on first use, and a worker imports the stream's
modules on its first task (measured: 4.8-5.4 CPU s in the JVM and 1.4-1.5 s in the workers
before a takeover's first commit). A rehearsal pays that while the standby waits: the same
plan, sink and Delta commits, reading the topic's newest records, on a scratch copy of the
stream that shares nothing a user or the running instance can see:

- a lake of its own under the lake's root (`_rehearsal/<stream>`), so that it is reachable
  wherever the lake is (every executor of a cluster, S3), with its own lease and deferrals;
- a checkpoint beside the stream's (`<checkpoint>.rehearsal`), with its own config snapshots;
- no webhooks, metrics, offsets mirrored to the consumer group, or fault points;
- a stream name of its own, so its log lines and its Spark query are told apart.

It ends after its first batch with records, or `QUIET_LIMIT_S` after its first batch if none
come, and its scratch locations are removed. A rehearsal that fails leaves the standby as it was
without one: it logs why and stands by. The running instance's death during a rehearsal is taken
over once the rehearsal ends.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from pyspark.sql.streaming.query import StreamingQuery

from storage.lake.lake_filesystem import filesystem_of, remove_folder
from storage.lake.s3_options import storage_options
from storage.lake.tables import REHEARSALS_DIR
from tenants.settings import AppSettings

log = logging.getLogger(__name__)

QUIET_LIMIT_S = 30.0
"""How long after its first batch a rehearsal waits for one with records: a quiet topic gives
it none."""
REHEARSAL_LIMIT_S = 600.0
"""Its longest run: a first batch on a cold JVM beside a busy stream took 38 s on two cores."""
REHEARSAL_MAX_RECORDS = 10_000
"""Its batches' bound (`maxOffsetsPerTrigger`): it reads from the topic's end, so a batch holds
what arrived in one trigger; this keeps a burst from making the rehearsal long."""
REHEARSAL_STOP_GRACE_S = 10.0
"""How long its stop waits for a batch in progress to commit."""
POLL_INTERVAL_S = 0.1
SUFFIX = "rehearsal"


@dataclass(frozen=True)
class Rehearsal:
    """The scratch copy of a stream's settings, and what removes its scratch locations."""

    settings: AppSettings

    @classmethod
    def of(cls, settings: AppSettings) -> Rehearsal:
        stream, kafka, lake = settings.stream, settings.kafka, settings.lake
        return cls(
            settings.model_copy(
                update={
                    "stream": stream.model_copy(
                        update={
                            "name": f"{stream.name}-{SUFFIX}",
                            "checkpoint_dir": f"{stream.checkpoint_dir.rstrip('/')}.{SUFFIX}",
                            "metrics_port": None,
                        }
                    ),
                    "kafka": kafka.model_copy(
                        update={
                            "starting_offsets": "latest",
                            "max_offsets_per_trigger": REHEARSAL_MAX_RECORDS,
                            "mirror_offsets": False,
                        }
                    ),
                    "lake": lake.model_copy(
                        update={"root": f"{lake.root.rstrip('/')}/{REHEARSALS_DIR}/{stream.name}"}
                    ),
                }
            )
        )

    def wait_for_records(self, query: StreamingQuery, stop: threading.Event) -> bool:
        """Wait until `query` committed a batch with records; False if `stop` was set, the
        query ended, no batch with records came within `QUIET_LIMIT_S` of its first batch, or
        `REHEARSAL_LIMIT_S` passed first."""
        deadline = time.monotonic() + REHEARSAL_LIMIT_S
        while time.monotonic() < deadline and not stop.is_set() and query.isActive:
            # Spark reports a batch's progress once it is committed.
            progress = query.recentProgress
            if any(batch["numInputRows"] > 0 for batch in progress):
                return True
            if progress:
                # The first batch is the cold one; the wait for records starts after it.
                deadline = min(deadline, time.monotonic() + QUIET_LIMIT_S)
            stop.wait(POLL_INTERVAL_S)
        return False

    def remove(self) -> None:
        """Remove the scratch lake and checkpoint; best effort, as the next rehearsal removes
        what a crashed one left before it starts."""
        for root, options in (
            (self.settings.lake.root, storage_options(self.settings.lake)),
            (self.settings.stream.checkpoint_dir, None),
        ):
            try:
                remove_folder(*filesystem_of(root, options))
            except OSError as error:
                log.warning("could not remove the rehearsal's %s: %s", root, error)

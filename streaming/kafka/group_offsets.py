"""The stream's offsets mirrored to a Kafka consumer group, for the tools operators already run.

`kafka-consumer-groups.sh`, Burrow, kafka-exporter and their alerts read a group's committed
offsets to show lag. The stream's truth is Spark's checkpoint, and it never reads the group
back: after each batch is committed (its Delta commits, then the checkpoint), the batch's end
offsets are written to the group `kafka.group_id`, the classic order for exactly-once into a
store (output first, offsets after). A failed mirror is a warning and a metric
(`tenant_windows_kafka_offset_mirror_failures_total`), never a failed batch: the next batch's
mirror carries the newer offsets anyway.

Mirrors are at least `kafka.mirror_interval_ms` apart, as Kafka's own consumers commit every
`auto.commit.interval.ms`: a batch a second would otherwise be an offset commit a second, which
lag tools sampling every few seconds never see, and which a broker that persists its state on
every change (the local test broker rewrites its whole data each time) pays for in full. The
newest offsets held back are mirrored by the next batch after the interval, when the stream
goes idle, and when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping

from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from streaming.kafka.client import KafkaSecurity, kafka_python_admin
from tenants.settings import KafkaSettings

log = logging.getLogger(__name__)

# Mirroring runs on Spark's listener thread: a broker that is gone may hold it this long.
_BUDGET_MS = 5_000


class GroupOffsets:
    """Writes end offsets to one consumer group; the admin client is kept between batches.

    Called from Spark's listener thread and, at stop, from the stopping thread."""

    def __init__(
        self, kafka: KafkaSettings, group_id: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bootstrap_servers = kafka.bootstrap_servers
        self.topic = kafka.topic
        self.group_id = group_id
        self.security = KafkaSecurity.of(kafka)
        self.interval_s = kafka.mirror_interval_ms / 1000
        self._clock = clock
        self._admin: KafkaAdminClient | None = None
        self._lock = threading.Lock()
        self._held: dict[int, int] | None = None
        """The newest end offsets not mirrored yet."""
        self._mirrored_at: float | None = None

    def mirror(self, end_offsets: Mapping[int, int]) -> bool | None:
        """Mirror `end_offsets` (partition: next offset to read) if the interval has passed
        since the last mirror, else hold them for the next; True once mirrored, False (with a
        warning) when the broker refused or did not answer, None when held."""
        with self._lock:
            self._held = dict(end_offsets)
            return self._mirror_held(due_only=True)

    def mirror_if_due(self) -> bool | None:
        """Mirror the offsets held back, if the interval has passed (the stream is idle)."""
        with self._lock:
            return self._mirror_held(due_only=True)

    def close(self) -> None:
        """Mirror what is held, then drop the client."""
        with self._lock:
            self._mirror_held(due_only=False)
            self._drop_admin()

    def _mirror_held(self, due_only: bool) -> bool | None:
        if self._held is None:
            return None
        now = self._clock()
        if due_only and self._mirrored_at is not None and now - self._mirrored_at < self.interval_s:
            return None
        mirrored = self._commit(self._held)
        if mirrored:
            self._held = None
            self._mirrored_at = now
        return mirrored

    def _commit(self, end_offsets: Mapping[int, int]) -> bool:
        offsets = {
            TopicPartition(self.topic, partition): OffsetAndMetadata(offset, "", -1)
            for partition, offset in end_offsets.items()
        }
        try:
            if self._admin is None:
                self._admin = kafka_python_admin(
                    self.bootstrap_servers, self.security, f"{self.group_id}-offsets", _BUDGET_MS
                )
            errors = self._admin.alter_group_offsets(self.group_id, offsets)
        except (KafkaError, OSError) as error:
            self._drop_admin()  # a new client next time: this one's connection may be broken
            log.warning(
                "could not mirror offsets to consumer group %s at %s: %s (the checkpoint "
                "holds them; the next batch tries again)",
                self.group_id,
                self.bootstrap_servers,
                error,
            )
            return False
        failed = {
            f"{tp.topic}/{tp.partition}": error.__name__
            for tp, error in errors.items()
            if error.__name__ != "NoError"
        }
        if failed:
            log.warning(
                "consumer group %s refused offsets %s (a member of that group is running? "
                "the group must be the stream's own)",
                self.group_id,
                failed,
            )
            return False
        return True

    def _drop_admin(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            with contextlib.suppress(KafkaError, OSError):  # dropped either way
                admin.close()

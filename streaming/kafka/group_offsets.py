"""The stream's offsets mirrored to a Kafka consumer group, for the tools operators already run.

`kafka-consumer-groups.sh`, Burrow, kafka-exporter and their alerts read a group's committed
offsets to show lag. The stream's truth is Spark's checkpoint, and it never reads the group
back: after each batch is committed (its Delta commits, then the checkpoint), the batch's end
offsets are written to the group `kafka.group_id`, the classic order for exactly-once into a
store (output first, offsets after). A failed mirror is a warning and a metric
(`tenant_windows_kafka_offset_mirror_failures_total`), never a failed batch: the next batch's
mirror carries the newer offsets anyway.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from streaming.kafka.client import KafkaSecurity, kafka_python_admin
from tenants.settings import KafkaSettings

log = logging.getLogger(__name__)

# Mirroring runs on Spark's listener thread: a broker that is gone may hold it this long.
_BUDGET_MS = 5_000


class GroupOffsets:
    """Writes end offsets to one consumer group; the admin client is kept between batches."""

    def __init__(self, kafka: KafkaSettings, group_id: str) -> None:
        self.bootstrap_servers = kafka.bootstrap_servers
        self.topic = kafka.topic
        self.group_id = group_id
        self.security = KafkaSecurity.of(kafka)
        self._admin: KafkaAdminClient | None = None

    def mirror(self, end_offsets: Mapping[int, int]) -> bool:
        """Commit `end_offsets` (partition: next offset to read) to the group; False, with a
        warning, when the broker refused or did not answer."""
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
            self.close()  # a new client next time: this one's connection may be broken
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

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            with contextlib.suppress(KafkaError, OSError):  # dropped either way
                admin.close()

"""Which state bucket a key is in, and which of the stateful stage's tasks runs each bucket.

A key's bucket comes from a hash of its tenant and source: a slot in `[0, state_buckets)`. Spark
then sends each bucket to a task by its own hash (`pmod(hash(bucket), shuffle_partitions)`), so
bucket numbers taken as they are land unevenly: 64 of them fall 21/14/15/14 over 4 tasks, 16 fall
6/6/1/3. With every bucket busy (thousands of tenants), the task with the most buckets holds the
batch up while the other cores wait. A balanced placement gives slot `s` the smallest bucket
number that Spark sends to task `s % shuffle_partitions` (`balanced_bucket_ids`), so every task
runs as many buckets as any other.

Both are frozen in a checkpoint (`checkpoint_identity`): checkpoints written before the
balanced placement keep the numbers as they are.
"""

from __future__ import annotations

BUCKET_COLUMN = "bucket"

_SEED = 42  # Spark's `hash()` and its hash partitioning
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def bucket_expression(state_buckets: int, balanced_for_tasks: int | None) -> str:
    """The SQL that buckets a routed record: by slot (`balanced_for_tasks` None), or balanced
    across that many stateful tasks."""
    slot = f"pmod(xxhash64(tenant, source), {state_buckets})"
    if balanced_for_tasks is None:
        return f"{slot} AS {BUCKET_COLUMN}"
    ids = ", ".join(
        f"{bucket}L" for bucket in balanced_bucket_ids(state_buckets, balanced_for_tasks)
    )
    return f"element_at(array({ids}), CAST({slot} AS INT) + 1) AS {BUCKET_COLUMN}"


def balanced_bucket_ids(state_buckets: int, shuffle_partitions: int) -> tuple[int, ...]:
    """For each slot `s`, the smallest unused bucket number that Spark's hash partitioning
    sends to task `s % shuffle_partitions`."""
    chosen: list[list[int]] = [[] for _ in range(shuffle_partitions)]
    wanted = [0] * shuffle_partitions
    for slot in range(state_buckets):
        wanted[slot % shuffle_partitions] += 1
    candidate = 0
    # Bounded: about `shuffle_partitions` candidates per bucket, as the hash spreads evenly.
    while any(len(chosen[task]) < wanted[task] for task in range(shuffle_partitions)):
        task = spark_partition(candidate, shuffle_partitions)
        if len(chosen[task]) < wanted[task]:
            chosen[task].append(candidate)
        candidate += 1
    return tuple(
        chosen[slot % shuffle_partitions][slot // shuffle_partitions]
        for slot in range(state_buckets)
    )


def spark_partition(value: int, partitions: int) -> int:
    """The task Spark's hash partitioning sends a BIGINT grouping key to."""
    return spark_hash_long(value) % partitions


def spark_hash_long(value: int) -> int:
    """Spark's `hash()` of one BIGINT (Murmur3 x86 32-bit, seed 42), as a signed 32-bit int."""
    low = value & _MASK
    high = (value >> 32) & _MASK
    h1 = _mix_h1(_SEED, _mix_k1(low))
    h1 = _mix_h1(h1, _mix_k1(high))
    h1 = _fmix(h1 ^ 8)
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _rotate_left(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _mix_k1(k1: int) -> int:
    return (_rotate_left((k1 * _C1) & _MASK, 15) * _C2) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotate_left(h1 ^ k1, 13) * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int) -> int:
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    return h1 ^ (h1 >> 16)

"""How a big settle is cut into slices: hash ranges of tenants, each committed on its own.

Settling everything adds a file per (tenant, source[, window date]) partition: 200,000 files at
100,000 tenants, a million and more at a million. In one commit the driver would hold every one
of those `add` actions at once (a million tenants' `events` made one 1.46 GB commit, and
`windows`' ran the driver out of memory), so a settle that adds more than `SLICE_FILES` files to
a table commits in slices instead. Every tenant hashes to one of `SLICE_BUCKETS` buckets (a
function of its id alone, the same on every machine); a slice is a range of buckets holding at
most `SLICE_FILES` settled files (or one bucket, if a bucket alone holds more).

Before the slices commit, the staged files are swapped, in one commit, for one staged file per
write task and slice holding the same rows (a run, `storage.lake.file_names`); each slice's
commit then swaps its runs for its settled files. So every commit is a swap of the same rows,
as an unsliced settle's one commit is, and the driver holds one slice's files at a time.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SLICE_BUCKETS = 4_096
"""Hash buckets of tenants: fine enough that a slice's size follows `SLICE_FILES` closely at any
tenant count, few enough that their counts cost nothing to hold."""
SLICE_FILES = 25_000
"""The most settled files one commit adds when it can be cut (a slice of one bucket may hold
more). About 40 MB of log JSON and of driver memory per commit, and few commits: 8 per table at
100,000 tenants."""


def tenant_bucket(tenant: str) -> int:
    """The slice bucket of a tenant: CRC-32 of its id, stable across processes and machines."""
    return zlib.crc32(tenant.encode()) % SLICE_BUCKETS


def tenant_buckets(tenants: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`tenant_bucket` of each value of a column, computed once per distinct tenant."""
    encoded = pc.dictionary_encode(tenants)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    buckets = np.array(
        [tenant_bucket(tenant) for tenant in encoded.dictionary.to_pylist()], dtype=np.int32
    )
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    return buckets[indices] if len(buckets) else np.zeros(len(indices), dtype=np.int32)


def plan_slices(files_per_bucket: np.ndarray, slice_files: int = SLICE_FILES) -> list[range]:
    """Consecutive bucket ranges covering every bucket, each holding at most `slice_files`
    files (or a single bucket), in bucket order; empty buckets join their neighbours."""
    slices: list[range] = []
    start = 0
    held = 0
    for bucket, files in enumerate(files_per_bucket.tolist()):
        if held and held + files > slice_files:
            slices.append(range(start, bucket))
            start, held = bucket, 0
        held += files
    slices.append(range(start, len(files_per_bucket)))
    return slices


def slice_of_buckets(slices: list[range]) -> np.ndarray:
    """For each bucket, the index of the slice holding it."""
    owner = np.zeros(SLICE_BUCKETS, dtype=np.int32)
    for index, buckets in enumerate(slices):
        owner[buckets.start : buckets.stop] = index
    return owner


def slice_digest(inputs_digest: str, index: int) -> str:
    """The inputs digest of slice `index`'s runs, cut from staged files of `inputs_digest`."""
    return hashlib.sha256(f"{inputs_digest}/slice {index}".encode()).hexdigest()[:16]

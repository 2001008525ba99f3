"""How a bucket's blob (`bucket_state`) is kept in Spark's state store: the layouts this version
reads, numbered as a checkpoint's identity records them (`checkpoint_identity`).

Both keep one state row per bucket, `(layout, blob)`; they differ in the blob's Spark type.

- Layout 2 keeps the blob as binary. Spark hands a stored value to Python by pickling it with
  Pyrolite, which turns a binary value into a Java string one byte at a time and then encodes
  that string as UTF-8: at a million tenants (16 buckets of 5 MB, every one read in every batch)
  that was half of the JVM's CPU and an eighth of the Python workers'.
- Layout 3 keeps it as base64 text. An ASCII string crosses both ways by bulk copies (the JVM's
  Latin-1 strings, Python's ASCII decoding) and base64 is decoded in C; the stored value is a
  third larger, which the state store's own compression of its files mostly takes back.

A new checkpoint is written in layout 3; a layout-2 checkpoint keeps its layout, since Spark
holds the state's schema fixed for a checkpoint's life.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from types import MappingProxyType

from pyspark.sql.types import BinaryType, DataType, IntegerType, StringType, StructField, StructType

BINARY_LAYOUT = 2
TEXT_LAYOUT = 3


@dataclass(frozen=True)
class StateLayout:
    number: int
    blob_type: DataType

    @property
    def schema(self) -> StructType:
        """The state row's schema: `applyInPandasWithState`'s `stateStructType`."""
        # pyspark 4.2 lower-cases nested state schemas on the worker: keep the state flat.
        return StructType(
            [StructField("layout", IntegerType()), StructField("keys_arrow", self.blob_type)]
        )

    def stored(self, blob: bytes) -> tuple[int, bytes | str]:
        """The state row that keeps `blob`."""
        if self.number == TEXT_LAYOUT:
            return self.number, base64.b64encode(blob).decode("ascii")
        return self.number, blob

    def blob(self, row: tuple[int, bytes | str]) -> bytes:
        """The blob a state row keeps; `RuntimeError` for a row of another layout, which
        `checkpoint_identity` refuses before a query starts."""
        number, value = row
        if number != self.number:
            raise RuntimeError(
                f"state layout {number} in the checkpoint, where its identity says {self.number}"
            )
        if isinstance(value, str):
            return base64.b64decode(value)
        return bytes(value)


LAYOUTS = MappingProxyType(
    {
        BINARY_LAYOUT: StateLayout(BINARY_LAYOUT, BinaryType()),
        TEXT_LAYOUT: StateLayout(TEXT_LAYOUT, StringType()),
    }
)
"""By number: `checkpoint_identity.READABLE_STATE_LAYOUTS`."""

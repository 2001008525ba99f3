"""Many byte strings of one shape, built at once.

A settle encodes a Parquet file per key, 200,000 of them at 100,000 tenants, and every file of a
table is the same sequence of pieces (page headers, levels, values, a footer) with other
numbers in it. Joined file by file in Python, a file of `events` took 28 us, half of a settled
file's cost. Here each piece is given once for every string (a constant, or a column of numbers
or byte ranges), and the strings are written into one buffer a piece at a time with NumPy: the
Python work grows with the pieces of the shape, not with the strings.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

_VARINT_BYTES = 10
"""An unsigned 64-bit varint's most bytes."""


@dataclass(frozen=True)
class _Piece:
    """One piece of every string: a constant, varints, 4-byte ints or ranges of `source`,
    whichever field is set."""

    lengths: np.ndarray
    """Bytes per string."""
    constant: np.ndarray | None = None
    varints: np.ndarray | None = None
    int32s: np.ndarray | None = None
    source: np.ndarray | None = None
    source_starts: np.ndarray | None = None


class BytePieces:
    """`count` byte strings, each the pieces added, in the order added."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pieces: list[_Piece] = []
        self._pending = bytearray()
        """Constant bytes not yet added: consecutive constants make one piece."""

    def constant(self, data: bytes) -> None:
        """The same bytes in every string."""
        self._pending += data

    def varints(self, values: np.ndarray) -> None:
        """Each string's value (unsigned) as a LEB128 varint."""
        values = np.asarray(values, dtype=np.uint64)
        self._add(_Piece(lengths=varint_lengths(values), varints=values))

    def int32s(self, values: np.ndarray) -> None:
        """Each string's value as 4 little-endian bytes."""
        self._add(_Piece(lengths=np.full(self.count, 4, np.int64), int32s=np.asarray(values)))

    def ranges(self, source: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """Each string's range [start, end) of `source` (bytes as uint8)."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(ends, dtype=np.int64) - starts
        self._add(_Piece(lengths=lengths, source=source, source_starts=starts))

    def mark(self) -> int:
        """Where the pieces added next begin, for `lengths_since`."""
        self._flush()
        return len(self._pieces)

    def lengths_since(self, mark: int) -> np.ndarray:
        """Each string's bytes in the pieces added since `mark`."""
        self._flush()
        total = np.zeros(self.count, np.int64)
        for piece in self._pieces[mark:]:
            total += piece.lengths
        return total

    def build(self) -> list[bytes]:
        """The strings."""
        self._flush()
        if not self._pieces or not self.count:
            return [b""] * self.count
        lengths = np.stack([piece.lengths for piece in self._pieces], axis=1)
        ends = np.cumsum(lengths.ravel()).reshape(lengths.shape)
        starts = ends - lengths
        out = np.empty(int(ends[-1, -1]), dtype=np.uint8)
        for index, piece in enumerate(self._pieces):
            _fill(out, starts[:, index], piece)
        data = out.tobytes()
        bounds = [0, *ends[:, -1].tolist()]
        return [data[first:end] for first, end in itertools.pairwise(bounds)]

    def _add(self, piece: _Piece) -> None:
        self._flush()
        self._pieces.append(piece)

    def _flush(self) -> None:
        if self._pending:
            constant = np.frombuffer(bytes(self._pending), dtype=np.uint8)
            self._pieces.append(
                _Piece(lengths=np.full(self.count, len(constant), np.int64), constant=constant)
            )
            self._pending = bytearray()


_VARINT_STEPS = np.array([1 << (7 * byte) for byte in range(1, _VARINT_BYTES)], dtype=np.uint64)
"""The least value of a varint of 2, 3, ... bytes."""


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """The bytes of each value's LEB128 varint."""
    steps = np.searchsorted(_VARINT_STEPS, np.asarray(values, dtype=np.uint64), side="right")
    return steps.astype(np.int64) + 1


def _fill(out: np.ndarray, at: np.ndarray, piece: _Piece) -> None:
    if piece.constant is not None:
        out[at[:, None] + np.arange(len(piece.constant))] = piece.constant
    elif piece.varints is not None:
        values, lengths = piece.varints, piece.lengths
        for byte in range(int(lengths.max(initial=0))):
            if byte:  # every varint has a first byte; fewer have the next ones
                has = lengths > byte
                values, lengths, at = values[has], lengths[has], at[has]
            seven = (values >> np.uint64(7 * byte)) & np.uint64(0x7F)
            out[at + byte] = (seven | ((lengths > byte + 1) * np.uint64(0x80))).astype(np.uint8)
    elif piece.int32s is not None:
        encoded = piece.int32s.astype("<u4").view(np.uint8).reshape(-1, 4)
        out[at[:, None] + np.arange(4)] = encoded
    else:
        assert piece.source is not None and piece.source_starts is not None
        lengths = piece.lengths
        total = int(lengths.sum())
        if not total:
            return
        # Each byte's place within its own range, then where that range starts here and there.
        within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[np.repeat(at, lengths) + within] = piece.source[
            np.repeat(piece.source_starts, lengths) + within
        ]

"""Byte strings built a piece at a time over all of them are the strings joined one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.lake.byte_pieces import BytePieces
from storage.lake.thrift_compact import varint

_UINT64 = st.integers(min_value=0, max_value=2**64 - 1)


@st.composite
def _strings(draw: st.DrawFn) -> tuple[BytePieces, list[bytes], list[tuple[list[int], list[int]]]]:
    """Pieces drawn at random, the strings they make, and at each look back to a mark the
    lengths since it (`lengths_since`, expected)."""
    count = draw(st.integers(min_value=0, max_value=20))
    source = draw(st.binary(min_size=1, max_size=64))
    pieces = BytePieces(count)
    expected = [b""] * count
    marks: list[tuple[int, list[int]]] = []
    looks: list[tuple[list[int], list[int]]] = []
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        kind = draw(st.sampled_from(["constant", "varints", "int32s", "ranges", "mark", "since"]))
        if kind == "constant":
            data = draw(st.binary(max_size=8))
            pieces.constant(data)
            added = [data] * count
        elif kind == "varints":
            values = draw(st.lists(_UINT64, min_size=count, max_size=count))
            pieces.varints(np.array(values, dtype=np.uint64))
            added = [varint(value) for value in values]
        elif kind == "int32s":
            values = draw(st.lists(st.integers(0, 2**32 - 1), min_size=count, max_size=count))
            pieces.int32s(np.array(values, dtype=np.int64))
            added = [value.to_bytes(4, "little") for value in values]
        elif kind == "ranges":
            bounds = [
                sorted(draw(st.tuples(st.integers(0, len(source)), st.integers(0, len(source)))))
                for _ in range(count)
            ]
            pieces.ranges(
                np.frombuffer(source, dtype=np.uint8),
                np.array([first for first, _ in bounds], dtype=np.int64),
                np.array([end for _, end in bounds], dtype=np.int64),
            )
            added = [source[first:end] for first, end in bounds]
        elif kind == "mark":
            marks.append((pieces.mark(), [len(string) for string in expected]))
            continue
        else:
            if marks:
                mark, lengths_then = marks[-1]
                since = [
                    len(string) - then for string, then in zip(expected, lengths_then, strict=True)
                ]
                looks.append((pieces.lengths_since(mark).tolist(), since))
            continue
        expected = [string + piece for string, piece in zip(expected, added, strict=True)]
    return pieces, expected, looks


@settings(max_examples=300, deadline=None)
@given(built=_strings())
def test_the_strings_are_their_pieces_joined(
    built: tuple[BytePieces, list[bytes], list[tuple[list[int], list[int]]]],
) -> None:
    pieces, expected, looks = built
    assert pieces.build() == expected
    for lengths, expected_lengths in looks:
        assert lengths == expected_lengths

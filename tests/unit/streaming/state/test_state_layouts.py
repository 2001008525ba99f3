"""A bucket's blob is kept in Spark's state as the layout of its checkpoint says, and read back
byte for byte."""

from __future__ import annotations

import os

import pytest

from streaming.checkpoint.checkpoint_identity import (
    NEW_CHECKPOINT_STATE_LAYOUT,
    READABLE_STATE_LAYOUTS,
)
from streaming.state.state_layouts import BINARY_LAYOUT, LAYOUTS, TEXT_LAYOUT


def test_every_layout_a_checkpoint_may_hold_has_its_state_schema() -> None:
    assert set(LAYOUTS) == READABLE_STATE_LAYOUTS
    assert NEW_CHECKPOINT_STATE_LAYOUT == TEXT_LAYOUT
    assert LAYOUTS[BINARY_LAYOUT].schema.simpleString() == "struct<layout:int,keys_arrow:binary>"
    assert LAYOUTS[TEXT_LAYOUT].schema.simpleString() == "struct<layout:int,keys_arrow:string>"


@pytest.mark.parametrize("number", sorted(READABLE_STATE_LAYOUTS))
@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 1_000_003])
def test_a_blob_reads_back_as_it_was_stored(number: int, size: int) -> None:
    layout = LAYOUTS[number]
    blob = os.urandom(size)
    row = layout.stored(blob)
    assert row[0] == number
    assert layout.blob(row) == blob


def test_the_text_layout_stores_ascii_which_crosses_to_the_jvm_by_bulk_copies() -> None:
    _, value = LAYOUTS[TEXT_LAYOUT].stored(bytes(range(256)) * 4)
    assert isinstance(value, str)
    assert value.isascii()


def test_a_row_of_another_layout_is_refused_not_misread() -> None:
    row = LAYOUTS[BINARY_LAYOUT].stored(b"blob")
    with pytest.raises(RuntimeError, match="state layout 2 in the checkpoint"):
        LAYOUTS[TEXT_LAYOUT].blob(row)

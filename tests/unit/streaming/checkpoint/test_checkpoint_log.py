"""The checkpoint's offset log, read without Spark: both sources' formats, and what is not one."""

from __future__ import annotations

import pytest

from streaming.checkpoint.checkpoint_log import parse_offsets_file

OFFSETS_HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795438247905,"conf":{}}\n'


def test_checkpoint_offsets_are_read_in_both_sources_formats() -> None:
    ours = OFFSETS_HEADER + '{"0": 1334, "1": 0, "10": 7}\n'
    sparks = OFFSETS_HEADER + '{"events": {"0": 5, "1": 6}}\n'
    assert parse_offsets_file(ours, "events") == {0: 1334, 1: 0, 10: 7}
    assert parse_offsets_file(sparks, "events") == {0: 5, 1: 6}


def test_a_file_that_is_not_an_offset_log_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Spark offset log entry"):
        parse_offsets_file('v2\n{}\n{"0": 1}\n', "events")

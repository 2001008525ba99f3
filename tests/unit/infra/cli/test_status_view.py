"""How `status` prints its sections: a table, or JSON."""

from __future__ import annotations

import json

from infra.cli.status_view import render_json, render_table
from streaming.observe.stream_status import KEYS, NO_DATA_YET, StatusSection


def test_the_table_format_shows_keys_without_data_under_the_same_columns() -> None:
    section = StatusSection(
        title=KEYS,
        rows=[
            {"tenant": "acme", "source": "web", "watermark": "2026-01-01T00:00:00", "late": 3},
            {"tenant": "initech", "source": "web", "watermark": NO_DATA_YET},
        ],
    )
    header, acme, initech = render_table([section]).splitlines()[1:4]
    assert header.split() == ["tenant", "source", "watermark", "late"]
    assert acme.split() == ["acme", "web", "2026-01-01T00:00:00", "3"]
    assert initech.split() == ["initech", "web", "no", "data", "yet"]
    assert json.loads(render_json([section]))[KEYS]["rows"][1]["watermark"] == NO_DATA_YET

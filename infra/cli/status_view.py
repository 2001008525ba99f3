"""`tenant-windows status` output: one JSON document, or readable plain-text tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from streaming.observe.stream_status import StatusSection


def render_json(sections: Sequence[StatusSection]) -> str:
    return json.dumps(
        {section.title: {"rows": section.rows, "note": section.note} for section in sections},
        indent=2,
        default=str,
    )


def render_table(sections: Sequence[StatusSection]) -> str:
    return "\n\n".join(_section_text(section) for section in sections) + "\n"


def _section_text(section: StatusSection) -> str:
    lines = [section.title.upper()]
    if section.rows:
        # Keys without data yet have fewer values: the header is the union, in first-seen order.
        columns = list(dict.fromkeys(name for row in section.rows for name in row))
        cells = [[_cell(row.get(name)) for name in columns] for row in section.rows]
        widths = [
            max(len(name), *(len(line[i]) for line in cells)) for i, name in enumerate(columns)
        ]
        lines.append("  ".join(name.ljust(w) for name, w in zip(columns, widths, strict=True)))
        lines.extend(
            "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in cells
        )
    if section.note:
        lines.append(f"({section.note})")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)

"""docs/reference/tables.md lists every column of every lake table, in order: a column added to
a table's schema and not to the reference fails here, not in a user's query."""

from __future__ import annotations

import re

from storage.lake.tables import LAKE_TABLES
from tests.support.paths import ROOT

REFERENCE = ROOT / "docs" / "reference" / "tables.md"
SECTION = re.compile(r"^### `(?P<table>\w+)`\n(?P<body>.*?)(?=^### |\Z)", re.S | re.M)
COLUMN_ROW = re.compile(r"^\| `(?P<column>\w+)` \|", re.M)


def documented_columns() -> dict[str, list[str]]:
    return {
        match.group("table"): COLUMN_ROW.findall(match.group("body"))
        for match in SECTION.finditer(REFERENCE.read_text())
    }


def test_every_table_and_column_is_in_the_reference() -> None:
    expected = {spec.name: [field.name for field in spec.schema] for spec in LAKE_TABLES}
    assert documented_columns() == expected


def test_every_table_says_how_it_is_partitioned() -> None:
    text = REFERENCE.read_text()
    for spec in LAKE_TABLES:
        partitions = ", ".join(f"`{column}`" for column in spec.partition_by) or "none"
        assert f"### `{spec.name}`\n\nPartitioned by {partitions}." in text, spec.name

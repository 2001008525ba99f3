"""The code blocks of the documentation, and the checks of the ones that are not run.

`bash` and `python` blocks are run by tests/integration/operations/test_docs_commands.py in a
prepared installation. A block in another language is checked for what it claims to be: a YAML
config example validates against the config models in a copy of the sample config, a JSON
webhook body is what `streaming/notify/payloads.py` sends, a PromQL expression names series the
service exports, SQL passes the tenant guard, and the `sh` lines of the README's fast loop name
test folders and markers that exist. Output, diagrams and container recipes are not checked;
`UNCHECKED` says why, and a block in a language of neither kind fails the test.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import textwrap
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from infra.service.query_metrics import QueryMetrics
from storage.lake.tables import ALL_TABLES
from storage.query.sql_guard import check_query
from streaming.notify.payloads import PaneFacts, webhook_body
from tenants.conf_reader import load_registry
from tenants.settings import load_settings
from tests.support.paths import ROOT
from tests.support.sample_conf import SAMPLE_CONF

DOCUMENTS = sorted(
    [
        ROOT / "README.md",
        # Every user page, in docs/ and its folders by kind (how-to/, reference/); the
        # engineering notes in docs/history/ are a record, not examples to run.
        *(page for page in (ROOT / "docs").rglob("*.md") if "history" not in page.parts),
        ROOT / "infra" / "cluster" / "README.md",
    ]
)
RUN = frozenset({"bash", "python"})
UNCHECKED = {
    "": "unlabelled: a diagram",
    "text": "program output, log lines and diagrams: what the product prints, not input",
    "dockerfile": "building it needs a container runtime and a Spark base image",
}
BLOCK = re.compile(
    r"(?:<!-- docs-test: skip (?P<skip>[^>]*?) -->\s*\n)?"
    r"^(?P<indent>[ \t]*)```(?P<language>[a-z]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.S | re.M,
)
STAND_IN_SECRETS = "sasl_password: stand-in\n"
STAND_IN_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
EXAMPLES_HEADING = re.compile(r"### `docs/examples/(?P<path>[^`]+)`\s*$")


@dataclass(frozen=True)
class DocBlock:
    document: Path
    line: int
    language: str
    body: str
    skip_reason: str | None
    heading: str
    """The last non-blank line before the block: a file name where the docs give one."""

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def doc_blocks(document: Path) -> list[DocBlock]:
    """Every fenced block of `document`, in order. README's first `bash` block is `.ci/run`
    itself (tests/integration/operations/test_readme.py checks it), so it is left out."""
    text = document.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        before = [line for line in text[: match.start()].splitlines() if line.strip()]
        blocks.append(
            DocBlock(
                document,
                text.count("\n", 0, match.start("body")) + 1,
                match.group("language"),
                # A block inside a list item is indented; it must be read as written.
                textwrap.dedent(match.group("body")),
                None if match.group("skip") is None else match.group("skip").strip(),
                before[-1] if before else "",
            )
        )
    if document == ROOT / "README.md":
        first_bash = next(i for i, block in enumerate(blocks) if block.language == "bash")
        del blocks[first_bash]
    return blocks


# -- YAML: config examples -------------------------------------------------------------------


def check_yaml(block: DocBlock, workdir: Path) -> None:
    """Validate the block as the config file it is, in a copy of the config it belongs to: a
    file of `docs/examples/` (its heading names it) replaces that file there; anything else is
    a file or fragment of the sample config, recognised by its keys (`id`: a tenant file,
    `sources`: sources.yaml, otherwise app.yaml settings), merged into a copy of `conf/`."""
    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block}: not a YAML mapping"
    body = _with_stand_in_files(block.body, data, workdir / "files")
    data = yaml.safe_load(body)
    heading = EXAMPLES_HEADING.match(block.heading)
    base = ROOT / "docs" / "examples" if heading else SAMPLE_CONF
    conf = workdir / "conf"
    shutil.copytree(base, conf)
    app_file = conf / "app.yaml"
    if heading:
        (conf / heading.group("path")).write_text(body)
    elif "id" in data:
        (conf / "tenants" / f"{data['id']}.yaml").write_text(body)
    elif set(data) == {"sources"}:
        _merge_into(conf / "sources.yaml", data)
    else:
        _merge_into(app_file, data)
    load_registry(conf)
    load_settings(app_file, environ={}, overrides={"conf_dir": str(conf)})


def _with_stand_in_files(body: str, data: Any, folder: Path) -> str:
    """`body` with each absolute `*_file` path (a CA, a mounted secret: the validation checks
    that they can be read) replaced by a stand-in file of the same kind under `folder`."""
    for key, value in _items(data):
        if key.endswith("_file") and isinstance(value, str) and value.startswith("/"):
            stand_in = folder / value.lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text(STAND_IN_SECRETS if key == "secrets_file" else STAND_IN_PEM)
            body = body.replace(value, str(stand_in))
    return body


def _items(data: Any) -> list[tuple[str, Any]]:
    if isinstance(data, Mapping):
        return [item for key, value in data.items() for item in [(str(key), value), *_items(value)]]
    if isinstance(data, list):
        return [item for value in data for item in _items(value)]
    return []


def _merge_into(file: Path, fragment: Mapping[str, Any]) -> None:
    data = yaml.safe_load(file.read_text()) or {}
    file.write_text(yaml.safe_dump(_merged(data, fragment), sort_keys=False))


def _merged(base: Mapping[str, Any], fragment: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in fragment.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


# -- JSON: the webhook body -------------------------------------------------------------------


def check_json(block: DocBlock, _workdir: Path) -> None:
    """A JSON document; one with a pane's fields is, byte for byte, the body the notifier
    sends for that pane."""
    document = json.loads(block.body)
    if not {"tenant", "window_start", "pane_index"} <= set(document):
        return
    pane = PaneFacts.from_row(
        {
            **document,
            "window_start": _iso_ms(document["window_start"]),
            "window_end": _iso_ms(document["window_end"]),
            "metrics": list(document["metrics"].items()),
            "batch_id": 0,
        }
    )
    assert webhook_body(pane).decode() == block.body.strip(), f"{block}: not the sent body"


def _iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


# -- PromQL: the series exist -----------------------------------------------------------------

SELECTOR = re.compile(r"(?P<name>tenant_windows_\w+)(?:\{(?P<labels>[^}]*)\})?")


def check_promql(block: DocBlock, _workdir: Path) -> None:
    """Every selector names a series, with those label values, that the query service's
    metrics export from the start (the stream's are named in its module)."""
    exported = generate_latest(QueryMetrics().registry).decode().splitlines()
    stream_metrics = (ROOT / "streaming" / "observe" / "stream_metrics.py").read_text()
    selectors = list(SELECTOR.finditer(block.body))
    assert selectors, f"{block}: names no tenant_windows_ series"
    for selector in selectors:
        name = selector.group("name")
        labels = [part.strip() for part in (selector.group("labels") or "").split(",") if part]
        found = any(
            line.startswith(name + "{") or line.startswith(name + " ")
            for line in exported
            if all(label.replace(" ", "") in line for label in labels)
        )
        base = re.sub(r"_(bucket|count|sum|total)$", "", name).removeprefix("tenant_windows_")
        assert found or f'_{base}"' in stream_metrics, f"{block}: no series {selector.group()}"


# -- SQL: the tenant guard ---------------------------------------------------------------------


def check_sql(block: DocBlock, _workdir: Path) -> None:
    """What a tenant may run: each statement passes the guard `sql --tenant` applies, over
    the views a tenant sees (docs/querying.md)."""
    views = (*(spec.name for spec in ALL_TABLES), "window_contents")
    for statement in filter(str.strip, block.body.split(";")):
        check_query(statement, views)


# -- sh: the README's fast loop ----------------------------------------------------------------


def check_sh(block: DocBlock, _workdir: Path) -> None:
    """Commands of the development loop (they run the test suite, which this test is part
    of): each is `.venv/bin/python -m pytest` with paths that exist and markers that are
    registered."""
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "markers"
    ]
    registered = {marker.split(":")[0].strip() for marker in markers}
    for line in block.body.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:3] == [".venv/bin/python", "-m", "pytest"], f"{block}: {line}"
        arguments = iter(words[3:])
        for word in arguments:
            if word == "-m":
                expression = next(arguments)
                names = set(re.findall(r"\w+", expression)) - {"not", "and", "or"}
                assert names <= registered, f"{block}: unknown marker in {expression!r}"
            elif not word.startswith("-"):
                assert (ROOT / word).exists(), f"{block}: {word} does not exist"


CHECKS: dict[str, Callable[[DocBlock, Path], None]] = {
    "yaml": check_yaml,
    "json": check_json,
    "promql": check_promql,
    "sql": check_sql,
    "sh": check_sh,
}

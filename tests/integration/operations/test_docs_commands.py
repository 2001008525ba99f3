"""Every command the docs show runs, and succeeds, against a real broker and lake.

The docs show commands in ```bash blocks. Each documentation file gets its own copy of one
prepared installation (a checkout's `conf/`, a topic with sample load, a lake and checkpoint
after `run --available-now`) and its blocks run in order, as a user would type them, with
`tenant-windows` on the PATH and `TW_*` variables pointing at the local broker and lake. A
block that cannot run on one machine (a cluster submit, a stream that runs until stopped) is
preceded by `<!-- docs-test: skip REASON -->`; the reason is checked to be there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.dev.local_stack import LocalKafka
from tests.support.paths import ROOT
from tests.support.sample_conf import SAMPLE_CONF, copy_conf
from tests.support.secured_kafka import namespace_unavailable_reason, secured_kafka

# README's first block is `.ci/run` itself (tests/integration/operations/test_readme.py checks it).
DOCUMENTS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "infra" / "cluster" / "README.md"]
)
BLOCK = re.compile(
    r"(?:<!-- docs-test: skip (?P<skip>[^>]*?) -->\s*\n)?```bash\n(?P<body>.*?)```", re.S
)
BLOCK_TIMEOUT_S = 300
TOPIC = "tenant-events"


@dataclass(frozen=True)
class DocBlock:
    document: Path
    line: int
    body: str
    skip_reason: str | None

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def doc_blocks(document: Path) -> list[DocBlock]:
    text = document.read_text()
    blocks = [
        DocBlock(
            document,
            text.count("\n", 0, match.start("body")) + 1,
            # A block inside a list item is indented; the shell must see it as written.
            textwrap.dedent(match.group("body")),
            None if match.group("skip") is None else match.group("skip").strip(),
        )
        for match in BLOCK.finditer(text)
    ]
    if document == ROOT / "README.md":
        blocks = blocks[1:]
    return blocks


def test_every_skipped_block_says_why() -> None:
    skipped = [
        block
        for document in DOCUMENTS
        for block in doc_blocks(document)
        if block.skip_reason is not None
    ]
    assert all(len(block.skip_reason or "") >= 10 for block in skipped), [str(b) for b in skipped]


@dataclass(frozen=True)
class Installation:
    """`workdir` as after onboarding the sample tenants and running the stream once; `pristine`
    is a copy to restore it from. The paths stay put, because a checkpoint records its lake."""

    workdir: Path
    pristine: Path

    def restore(self) -> Path:
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.copytree(self.pristine, self.workdir)
        return self.workdir


# Session-scoped, so each pytest worker builds its own and the slow tests below spread over
# the workers (tests/conftest.py keeps a module's tests together only for module fixtures).
@pytest.fixture(scope="session")
def installation(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Installation:
    root = tmp_path_factory.mktemp("docs")
    workdir = root / "installation"
    copy_conf(SAMPLE_CONF, workdir)
    kafka.create_topic(TOPIC, partitions=2)
    environ = _environ(workdir, kafka)
    for command in (
        ["produce", "--count", "3000", "--seed", "11"],
        ["run", "--available-now"],
    ):
        subprocess.run(
            [sys.executable, "-m", "infra.cli", *command],
            cwd=workdir,
            env=environ,
            check=True,
            timeout=BLOCK_TIMEOUT_S,
        )
    shutil.copytree(workdir, root / "pristine")
    return Installation(workdir, root / "pristine")


def _environ(workdir: Path, kafka: LocalKafka) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYTHONPATH": str(ROOT),
        "HOME": str(workdir),
        "TW_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "TW_KAFKA__TOPIC": TOPIC,
        "TW_LAKE__ROOT": str(workdir / "lake"),
        "TW_STREAM__CHECKPOINT_DIR": str(workdir / "checkpoint"),
    }


MANAGED_TOPIC = "managed-events"


@pytest.fixture(scope="session")
def managed_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A broker that speaks only TLS + SCRAM-SHA-256, for the docs' managed-Kafka example:
    what a provider would hand over, as `MANAGED_KAFKA_*` variables."""
    if namespace_unavailable_reason() is not None:
        yield {}
        return
    with secured_kafka(tmp_path_factory.mktemp("managed"), "sasl_ssl", "SCRAM-SHA-256") as broker:
        broker.create_topic(MANAGED_TOPIC, 2)
        yield {
            "MANAGED_KAFKA_BOOTSTRAP": broker.bootstrap_servers,
            "MANAGED_KAFKA_CA": str(broker.ca_file),
            "MANAGED_KAFKA_USER": str(broker.username),
            "MANAGED_KAFKA_PASSWORD": str(broker.password),
        }


@pytest.mark.parametrize(
    "document",
    [document for document in DOCUMENTS if doc_blocks(document)],
    ids=lambda document: str(document.relative_to(ROOT)),
)
def test_the_commands_of(
    document: Path, installation: Installation, kafka: LocalKafka, managed_kafka: dict[str, str]
) -> None:
    if "$MANAGED_KAFKA_" in document.read_text() and not managed_kafka:
        pytest.skip(
            f"no TLS broker for the managed-Kafka example: {namespace_unavailable_reason()}"
        )
    workdir = installation.restore()
    environ = {**_environ(workdir, kafka), **managed_kafka}
    for block in doc_blocks(document):
        if block.skip_reason is not None:
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.body],
            cwd=workdir,
            env=environ,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"{block} exited {done.returncode}\n--- block\n{block.body}"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )

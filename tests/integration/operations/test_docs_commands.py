"""Every example the docs show runs, or is checked, against a real broker and lake.

The docs show commands in ```bash blocks and code in ```python blocks. Each documentation file
gets its own copy of one prepared installation (a checkout's `conf/`, a topic with sample load,
a lake and checkpoint after `run --available-now`) and its blocks run in order, as a user would
type them, with `tenant-windows` and `python` on the PATH and `TW_*` variables pointing at the
local broker and lake. A block that cannot run on one machine (a cluster submit, a stream that
runs until stopped) is preceded by `<!-- docs-test: skip REASON -->`; the reason is checked to
be there. Blocks in other languages are checked for what they claim to be
(tests/support/doc_examples.py), and a sentence saying that a test checks something names a
test that exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.dev.local_stack import LocalKafka
from tests.support.doc_examples import CHECKS, DOCUMENTS, RUN, UNCHECKED, DocBlock, doc_blocks
from tests.support.paths import ROOT
from tests.support.sample_conf import SAMPLE_CONF, copy_conf
from tests.support.secured_kafka import namespace_unavailable_reason, secured_kafka

BLOCK_TIMEOUT_S = 300
TOPIC = "tenant-events"
# A sentence that says a test checks something; its paragraph must name the test.
TEST_CLAIM = re.compile(
    r"\b(?:the tests? (?:checks?|compute|load)|a test checks|tested with|unit-tested|"
    r"(?:the )?tests? (?:checks?|runs?) (?:this|them|it))\b",
    re.I,
)
TEST_PATH = re.compile(r"tests/[\w/]+\.py")


def run_blocks(document: Path) -> list[DocBlock]:
    return [block for block in doc_blocks(document) if block.language in RUN]


def test_every_skipped_block_says_why() -> None:
    skipped = [
        block
        for document in DOCUMENTS
        for block in doc_blocks(document)
        if block.skip_reason is not None
    ]
    assert all(len(block.skip_reason or "") >= 10 for block in skipped), [str(b) for b in skipped]


def test_every_block_is_run_checked_or_says_why_not() -> None:
    languages = {block.language: str(block) for d in DOCUMENTS for block in doc_blocks(d)}
    unknown = {
        language: where
        for language, where in languages.items()
        if language not in RUN | set(CHECKS) | set(UNCHECKED)
    }
    assert not unknown, f"blocks in a language no test runs or checks: {unknown}"
    assert "python" in languages, "no python block: is the docs' delta-rs example still one?"


@pytest.mark.parametrize(
    "block",
    [block for d in DOCUMENTS for block in doc_blocks(d) if block.language in CHECKS],
    ids=str,
)
def test_the_example(block: DocBlock, tmp_path: Path) -> None:
    CHECKS[block.language](block, tmp_path)


def test_every_claim_that_a_test_checks_names_an_existing_test() -> None:
    unnamed, missing = [], []
    for document in DOCUMENTS:
        for paragraph in re.split(r"\n\s*\n", document.read_text()):
            named = TEST_PATH.findall(paragraph)
            missing += [f"{document.name}: {path}" for path in named if not (ROOT / path).is_file()]
            claim = TEST_CLAIM.search(paragraph)
            if claim and not named:
                unnamed.append(
                    f"{document.name}: ...{paragraph[max(claim.start() - 80, 0) : claim.end()]}"
                )
    assert not missing, f"the docs name tests that do not exist: {missing}"
    assert not unnamed, "a claim that a test checks something names no test:\n" + "\n".join(unnamed)


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


# Module-scoped, so tests/conftest.py keeps the pages on one worker and it is built once: as a
# session fixture each of the three workers built its own (a produce and an available-now run,
# about a minute of a worker each on a busy machine), to spread the pages whose run is now
# started first and overlaps the rest of the suite anyway.
@pytest.fixture(scope="module")
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
    [document for document in DOCUMENTS if run_blocks(document)],
    ids=lambda document: str(document.relative_to(ROOT)),
)
def test_the_commands_of(
    document: Path, installation: Installation, kafka: LocalKafka, request: pytest.FixtureRequest
) -> None:
    # Only the page that uses it starts the secured broker: asked for by every page, it was
    # started on each worker that ran one (a network namespace, a broker and a TLS terminator).
    managed_kafka: dict[str, str] = {}
    if "$MANAGED_KAFKA_" in document.read_text():
        managed_kafka = request.getfixturevalue("managed_kafka")
        if not managed_kafka:
            pytest.skip(
                f"no TLS broker for the managed-Kafka example: {namespace_unavailable_reason()}"
            )
    workdir = installation.restore()
    environ = {**_environ(workdir, kafka), **managed_kafka}
    for block in run_blocks(document):
        if block.skip_reason is not None:
            continue
        # As printed: a shell block with bash, a Python block with the installation's Python.
        interpreter = (
            ["bash", "-euo", "pipefail", "-c"]
            if block.language == "bash"
            else [sys.executable, "-c"]
        )
        done = subprocess.run(
            [*interpreter, block.body],
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

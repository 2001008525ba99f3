"""Notifications end to end: a real broker, Spark query, Delta tables and HTTP endpoint.

Each committed pane that qualifies is received under its idempotency key, always with the same
body, across crashes of the stream and of the notifier; nothing uncommitted is announced; a
failing endpoint is retried with backoff, then dead-lettered without holding up other tenants,
and `tenant-windows notify retry` delivers it once it recovers.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.cli.main import main as cli_main
from infra.dev.load_generator import LoadSpec
from storage.lake.delivery_outbox import DeliveryOutbox, dead_letter_summary
from storage.lake.tables import DELIVERIES, WINDOWS
from streaming.app import StreamApp
from streaming.fault_points import FaultPoint
from streaming.notify.notifier import notify_targets
from streaming.notify.payloads import PaneFacts, body_for, idempotency_key, qualifies
from streaming.observe.stream_status import DEAD_LETTERS, NOTIFICATIONS, gather_status
from tenants.conf_reader import load_registry
from tests.support.datasets import produce_dataset
from tests.support.pipeline_harness import Pipeline
from tests.support.sample_conf import copy_conf
from tests.support.stream_process import crash_in_turn
from tests.support.webhook_receiver import Receiver, serve

pytestmark = pytest.mark.integration

BATCH_SIZE = 150
RECORDS = 600  # four batches
ACME_HOOK_VARIABLE = "NOTIFY_TEST_ACME_HOOK"
FAST_RETRIES = {
    "TW_NOTIFY__MAX_ATTEMPTS": "3",
    "TW_NOTIFY__FIRST_BACKOFF": "50ms",
    "TW_NOTIFY__MAX_BACKOFF": "200ms",
    "TW_NOTIFY__POLL_INTERVAL": "200ms",
}
DRAIN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    endpoint = Receiver()
    server = serve(endpoint)
    try:
        yield endpoint, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def topic(kafka: Any, conf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    # 10 s between a key's records: each batch closes several of its windows.
    spec = LoadSpec(count=RECORDS, step=10_000, late_share=0.1, malformed_share=0.05, seed=5)
    return produce_dataset(kafka, conf_dir, tmp_path_factory.mktemp("topic"), spec)


def notify_conf(sample_conf: Path, workdir: Path, base_url: str, run: str, globex: str) -> Path:
    """The sample config plus endpoints of every kind and reference style, under `/<run>/`."""
    conf = copy_conf(sample_conf, workdir)
    (conf / "hooks").mkdir()
    # Slack's path is its token; the secret file is read at delivery time.
    (conf / "hooks" / "globex.url").write_text(f"{base_url}/{run}/{globex}/services/T1/B2/tok\n")
    (conf / "tenants" / "acme.yaml").write_text(
        "id: acme\nsources:\n"
        "  web:\n    notify:\n"
        f"      - {{kind: webhook, url: '${{{ACME_HOOK_VARIABLE}}}', on: every_pane, timeout: 2s}}\n"
        "  billing: {}\n"
    )
    (conf / "tenants" / "globex.yaml").write_text(
        "id: globex\nsources:\n"
        "  web:\n    allowed_lateness: 5m\n    notify:\n"
        "      - {kind: slack, url: 'secret:hooks/globex.url', on: final}\n"
        "  billing: {}\n"
    )
    # initech keeps the source's endpoint: billing's, given in sources.yaml.
    sources = (conf / "sources.yaml").read_text()
    (conf / "sources.yaml").write_text(
        sources.replace(
            "  billing:\n",
            f"  billing:\n    notify:\n      - {{kind: webhook, url: '{base_url}/{run}/ok/billing'}}\n",
        )
    )
    return conf


def make_pipeline(kafka: Any, workdir: Path, conf: Path, topic: str, run: str) -> Pipeline:
    return Pipeline(
        kafka, workdir, conf, topic, partitions=2, max_offsets_per_trigger=BATCH_SIZE,
        stream_name=f"notify-{run}", environ=dict(FAST_RETRIES),
    )  # fmt: skip


def run_and_deliver(pipeline: Pipeline, spark: Any) -> None:
    """`run --available-now` in this process: the query to its end, then every delivery."""
    app = StreamApp(pipeline.settings, pipeline.lake).start(spark, True)
    abandon = threading.Event()
    timer = threading.Timer(DRAIN_TIMEOUT_S, abandon.set)
    timer.start()
    try:
        assert app.query.awaitTermination(timeout=240), "the query did not finish"
        assert app.query.exception() is None, app.query.exception()
        assert app.wait_for_notifications(abandon), "deliveries did not finish"
    finally:
        timer.cancel()
        app.stop()


def expected_deliveries(pipeline: Pipeline, acme_url: str) -> dict[tuple[str, str], bytes]:
    """(endpoint path, key) -> body for every qualifying pane of the committed `windows` rows."""
    registry = load_registry(pipeline.conf_dir)
    expected = {}
    for row in pipeline.lake.open(WINDOWS).to_pyarrow_table().to_pylist():
        pane = PaneFacts.from_row(row)
        for target in notify_targets(registry, pane.tenant, pane.source):
            if qualifies(target.on, pane):
                reference = target.url.get_secret_value()
                if reference.startswith("${"):
                    reference = acme_url
                elif reference.startswith("secret:"):
                    secret = pipeline.conf_dir / reference.removeprefix("secret:")
                    reference = secret.read_text().strip()
                path = "/" + reference.split("/", 3)[3]
                key = idempotency_key(pipeline.stream_name, pane)
                # One pane, one key: no two committed rows may share a key.
                assert (path, key) not in expected, f"two committed panes share a key: {pane}"
                expected[(path, key)] = body_for(target.kind, pane)
    return expected


def received_bodies(receiver: Receiver, run: str) -> dict[tuple[str, str], set[bytes]]:
    bodies: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    for request in receiver.received(f"/{run}/"):
        bodies[(request.path, request.key)].add(request.body)
    return bodies


def assert_each_pane_announced_once(
    pipeline: Pipeline, receiver: Receiver, run: str, acme_url: str
) -> dict[tuple[str, str], bytes]:
    expected = expected_deliveries(pipeline, acme_url)
    received = received_bodies(receiver, run)
    # Every tenant and endpoint kind took part, so the comparison below is not vacuous.
    assert {path.split("/")[2] for path, _key in expected} == {"ok", "acme", "globex"}
    assert {path.split("?")[0].split("/")[3] for path, _key in expected} >= {
        "web",
        "services",
        "billing",
    }
    # Nothing that was not committed was announced; nothing committed was left out.
    assert set(received) == set(expected)
    assert {key: len(bodies) for key, bodies in received.items() if len(bodies) > 1} == {}
    assert {key: next(iter(bodies)) for key, bodies in received.items()} == expected
    # The outbox agrees: each delivery's last attempt succeeded, through the last windows batch.
    outbox = DeliveryOutbox(pipeline.lake, pipeline.stream_name)
    windows_batch = pipeline.lake.committed_batch(WINDOWS, pipeline.stream_name)
    assert outbox.delivered_through() == windows_batch
    progress = outbox.progress_after(-1)
    assert len(progress) == len(expected)
    assert all(entry.finished for entry in progress.values())
    assert outbox.dead_letters() == []
    return expected


# Killed at each point in turn: the restart after one kill is killed at the next, and the last
# restart, in this process, runs to the end and delivers what is left.
CRASH_POINTS = [
    f"{FaultPoint.BETWEEN_TABLE_COMMITS}@1",
    f"{FaultPoint.BEFORE_DELIVERY}@1",
    f"{FaultPoint.AFTER_DELTA_COMMITS}@2",
    f"{FaultPoint.AFTER_DELIVERY_BEFORE_RECORD}@2",
]


def test_crashes_anywhere_still_announce_each_committed_pane_once_per_key(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    topic: str,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, base_url = receiver
    run = "crashes"
    acme_url = f"{base_url}/{run}/acme/web?token=t0p"
    monkeypatch.setenv(ACME_HOOK_VARIABLE, acme_url)
    conf = notify_conf(conf_dir, tmp_path, base_url, run, globex="globex")
    pipeline = make_pipeline(kafka, tmp_path, conf, topic, run)
    crash_in_turn(pipeline, CRASH_POINTS)

    run_and_deliver(pipeline, spark)

    expected = assert_each_pane_announced_once(pipeline, endpoint, run, acme_url)
    # The kill may cut a request short (headers sent, body not): that too was of a committed pane.
    cut_short = {(r.path, r.key) for r in endpoint.incomplete if r.path.startswith(f"/{run}/")}
    assert cut_short <= set(expected)
    requests = endpoint.received(f"/{run}/")
    # A crash came after a request was answered: that key was sent again, same body.
    assert len(requests) > len(expected)
    # No secret reached the outbox: endpoints are redacted, bodies hold pane facts only.
    stored = pipeline.lake.open(DELIVERIES).to_pandas()
    assert not stored.empty
    for column in ("endpoint", "error", "body"):
        text = " ".join(stored[column].dropna().astype(str))
        assert "t0p" not in text and "/tok" not in text and "B2" not in text
    assert set(stored["endpoint"]) == {
        f"{base_url}/{run}/acme/web?token=***",
        "http://127.0.0.1:{}/{}/***".format(base_url.rsplit(":", 1)[1], run),
        f"{base_url}/{run}/ok/billing",
    }


def test_failing_endpoints_are_retried_dead_lettered_and_retried_on_demand(
    kafka: Any,
    spark: Any,
    conf_dir: Path,
    topic: str,
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint, base_url = receiver
    run = "failing"
    acme_url = f"{base_url}/{run}/flaky/acme/web"
    monkeypatch.setenv(ACME_HOOK_VARIABLE, acme_url)
    conf = notify_conf(conf_dir, tmp_path, base_url, run, globex="down")
    pipeline = make_pipeline(kafka, tmp_path, conf, topic, run)
    endpoint.down.set()
    try:
        run_and_deliver(pipeline, spark)
    finally:
        endpoint.down.clear()
    expected = expected_deliveries(pipeline, acme_url)
    globex = {delivery for delivery in expected if "/down/" in delivery[0]}
    others = set(expected) - globex
    assert globex and others
    succeeded = {
        (request.path, request.key)
        for request in endpoint.received(f"/{run}/")
        if request.status == 200
    }
    # The flaky endpoint got its deliveries after backoff; the always-failing one held up none.
    assert succeeded == others
    flaky_failures = [r for r in endpoint.received(f"/{run}/flaky/") if r.status == 503]
    assert len(flaky_failures) == endpoint.flaky_failures
    summary = dead_letter_summary(pipeline.lake, pipeline.stream_name)
    assert [(group.tenant, group.source, group.deliveries) for group in summary] == [
        ("globex", "web", len(globex))
    ]
    assert summary[0].last_error == "HTTP 503"
    status = {section.title: section for section in gather_status(pipeline.settings)}
    # Dead letters count as finished: the notifier is not behind.
    windows_batch = pipeline.lake.committed_batch(WINDOWS, pipeline.stream_name)
    assert status[NOTIFICATIONS].rows == [
        {
            "windows_batch": windows_batch,
            "finished_through_batch": windows_batch,
            "batches_behind": 0,
        }
    ]
    shown = status[DEAD_LETTERS]
    assert [(row["tenant"], row["deliveries"]) for row in shown.rows] == [("globex", len(globex))]
    # A Slack hook's path is its token: status shows the endpoint without it.
    assert "/down/" not in str(shown.rows)
    # The budget was spent: 3 attempts per globex delivery.
    stored = pipeline.lake.open(DELIVERIES).to_pandas()
    globex_attempts = stored[stored["kind"] == "slack"].groupby("idempotency_key")["attempt"]
    assert set(globex_attempts.max()) == {3}

    code = cli_main(
        [
            "notify", "retry", "--conf", str(conf), "--lake-root", pipeline.settings.lake.root,
            "--stream-name", pipeline.stream_name,
        ]
    )  # fmt: skip

    assert code == 0
    succeeded = {
        (request.path, request.key): request.body
        for request in endpoint.received(f"/{run}/")
        if request.status == 200
    }
    assert succeeded == expected
    assert dead_letter_summary(pipeline.lake, pipeline.stream_name) == []
    retried = pipeline.lake.open(DELIVERIES).to_pandas()
    assert set(
        retried[retried["outcome"] == "succeeded"].groupby("idempotency_key")["attempt"].max()
    ) >= {4}
    # The operator's SQL has the outbox as a view.
    capsys.readouterr()
    code = cli_main(
        [
            "sql", "SELECT outcome, count(*) AS n FROM deliveries GROUP BY outcome",
            "--lake-root", pipeline.settings.lake.root, "--format", "json",
        ]
    )  # fmt: skip
    assert code == 0
    counted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    assert {row["outcome"]: row["n"] for row in counted} == retried[
        "outcome"
    ].value_counts().to_dict()

"""A real Prometheus for tests: Debian's `prometheus` binary on loopback, scraping given targets
with given rule files, started and stopped by its PID (`LocalProcess`)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from infra.dev.local_process import LocalProcess
from infra.dev.local_stack import find_free_loopback_port

INSTALL_HINT = (
    "Debian's prometheus package (it brings promtool too): "
    "`apt-get install -y prometheus`; infra/test.sh installs it when run as root"
)


def debian_binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; a missing one fails the test, never skips it."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not installed: the tests need {INSTALL_HINT}")
    return path


class LocalPrometheus(LocalProcess):
    """Prometheus with a generated config: each job scrapes one `host:port` every
    `scrape_interval_s`, and rules are evaluated as often."""

    name = "prometheus"
    ready_deadline_s = 30.0

    def __init__(
        self,
        workdir: Path,
        jobs: Mapping[str, str],
        rule_files: Sequence[Path],
        scrape_interval_s: int = 1,
    ) -> None:
        self.workdir = workdir
        self.jobs = dict(jobs)
        self.rule_files = list(rule_files)
        self.scrape_interval_s = scrape_interval_s
        self.port = find_free_loopback_port()
        self.config_path = workdir / "prometheus.yml"
        super().__init__(workdir / "prometheus.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def config(self) -> dict[str, Any]:
        interval = f"{self.scrape_interval_s}s"
        return {
            # A scrape may take at most its interval; Prometheus refuses a longer timeout.
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(path.resolve()) for path in self.rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in self.jobs.items()
            ],
        }

    def start(self) -> LocalPrometheus:
        binary = debian_binary("prometheus")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self._launch(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address={self.address}",
            ],
            cwd=self.workdir,
        )
        return self

    def _probe(self) -> None:
        requests.get(f"{self.url}/-/ready", timeout=2).raise_for_status()

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a `/api/v1/...` answer that succeeded."""
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", body
        return body["data"]

    def query(self, expression: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's vector: each series' labels (without `__name__`) to its value."""
        data = self.api("query", query=expression)
        assert data["resultType"] == "vector", data
        return {
            tuple(sorted((k, v) for k, v in item["metric"].items() if k != "__name__")): float(
                item["value"][1]
            )
            for item in data["result"]
        }

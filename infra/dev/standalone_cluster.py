"""A standalone Spark cluster on loopback whose nodes know nothing of this project.

Its master and workers run from a separate virtualenv that has only pyspark, pandas and pyarrow
(what a stock PySpark node has), with that virtualenv first on their PATH, so executors run its
`python3`. With `blind_to`, each worker (and so its executors) runs in its own mount namespace
with an empty tmpfs over that folder: the checkout and its `.venv` are not there, and anything
an executor imports must have been shipped by the job. That needs root (`unshare -m`).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from infra.dev.local_process import LocalProcess
from infra.dev.local_stack import find_free_loopback_port

NODE_DISTRIBUTIONS = ("pyspark", "pandas", "pyarrow")
"""What the nodes' Python has, at the driver's versions (PySpark requires them to match)."""
_READY_MARKER = ".complete"
_HTTP_TIMEOUT_S = 2.0
_NODE_PATH_TAIL = ("/usr/local/bin", "/usr/bin", "/bin")


def node_python_env(cache_dir: Path) -> Path:
    """A virtualenv with only the node distributions, built once per versions and reused.

    Built with this interpreter's pip into a venv without pip of its own (both save seconds),
    from pip's cache when it has the wheels; a lock keeps concurrent test runs from building it
    twice.
    """
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in NODE_DISTRIBUTIONS]
    tag = "-".join(pin.replace("==", "") for pin in pins)
    env_dir = cache_dir / f"node-python-{sys.implementation.cache_tag}-{tag}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f"{env_dir.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env_dir / _READY_MARKER).exists():
            shutil.rmtree(env_dir, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True
            )
            install = [
                sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"),
                "install", "--quiet", "--no-compile", "--disable-pip-version-check", *pins,
            ]  # fmt: skip
            subprocess.run(install, check=True)
            (env_dir / _READY_MARKER).touch()
    return env_dir


def spark_home(env_dir: Path) -> Path:
    """The pyspark package folder of `env_dir`: it holds `bin/spark-class` and the jars."""
    found = sorted(env_dir.glob("lib/python3*/site-packages/pyspark"))
    if not found:
        raise RuntimeError(f"no pyspark in {env_dir}")
    return found[0]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response:
        return json.load(response)


class _SparkDaemon(LocalProcess):
    """A master or worker JVM, in its own process group with the executors it starts."""

    def __init__(self, log_path: Path, env_dir: Path) -> None:
        super().__init__(log_path)
        self.env_dir = env_dir
        self.spark_class = spark_home(env_dir) / "bin" / "spark-class"

    def node_environ(self) -> dict[str, str]:
        """What a node's shell has: its Python first on PATH, nothing of the driver's."""
        environ = {
            "PATH": os.pathsep.join([str(self.env_dir / "bin"), *_NODE_PATH_TAIL]),
            "HOME": os.environ.get("HOME", "/root"),
            "SPARK_HOME": str(spark_home(self.env_dir)),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "LANG": "C.UTF-8",
        }
        if "JAVA_HOME" in os.environ:
            environ["JAVA_HOME"] = os.environ["JAVA_HOME"]
        return environ

    def _after_stop(self) -> None:
        # Executor JVMs and their Python workers are in this process group (we created it
        # with start_new_session, its id is our PID); one orphaned by a worker that died
        # first is no descendant any more, but is still in the group.
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)


class SparkMaster(_SparkDaemon):
    name = "spark master"
    # A JVM's start: seconds on a quiet machine, but CI starts a cluster beside three other test
    # workers' streams, where one worker took 30 s to reach the master and had not registered
    # 30 s later. A daemon that dies still fails at once (its exit code is checked each probe).
    ready_deadline_s = 180.0
    probe_interval_s = 0.5

    def __init__(self, workdir: Path, env_dir: Path) -> None:
        super().__init__(workdir / "master.log", env_dir)
        self.port = find_free_loopback_port()
        self.webui_port = find_free_loopback_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return self.url

    def state(self) -> dict[str, Any]:
        """The master's `/json/` page: workers, active and completed applications."""
        state: dict[str, Any] = _get_json(f"http://127.0.0.1:{self.webui_port}/json/")
        return state

    def start(self) -> Self:
        command = [
            str(self.spark_class), "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port),
        ]  # fmt: skip
        # Its REST submission server would take the fixed port 6066.
        environ = {**self.node_environ(), "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        self._launch(command, env=environ)
        return self

    def _probe(self) -> None:
        if self.state().get("status") != "ALIVE":
            raise RuntimeError("the master is not ALIVE yet")


class SparkWorker(_SparkDaemon):
    name = "spark worker"
    ready_deadline_s = SparkMaster.ready_deadline_s
    probe_interval_s = 0.5

    def __init__(
        self, workdir: Path, env_dir: Path, master: SparkMaster, blind_to: Path | None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(workdir / "worker.log", env_dir)
        self.master = master
        self.blind_to = blind_to
        self.work_dir = workdir / "work"
        self.port = find_free_loopback_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        command = [
            str(self.spark_class), "org.apache.spark.deploy.worker.Worker", self.master.url,
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", "0",
            "--cores", "1", "--memory", "1g", "--work-dir", str(self.work_dir),
        ]  # fmt: skip
        if self.blind_to is not None:
            # `exec` keeps one PID from unshare to the JVM: the process we stop is the worker.
            command = [
                "unshare", "-m", "--propagation", "private",
                "sh", "-c", 'mount -t tmpfs none "$0" && exec "$@"', str(self.blind_to),
                *command,
            ]  # fmt: skip
        self._launch(command, env=self.node_environ())
        return self

    def _probe(self) -> None:
        for worker in self.master.state().get("workers", []):
            if worker.get("port") == self.port and worker.get("state") == "ALIVE":
                return
        raise RuntimeError("the worker has not registered with the master yet")

    def executor_logs(self, app_id: str) -> list[Path]:
        """The stderr of each executor this worker ran for the application."""
        return sorted((self.work_dir / app_id).glob("*/stderr"))


class StandaloneCluster:
    """A master and `workers` one-core workers; stopped, with every executor, on exit."""

    def __init__(
        self, workdir: Path, env_dir: Path, workers: int = 2, blind_to: Path | None = None
    ) -> None:
        self.master = SparkMaster(workdir, env_dir)
        self.workers = [
            SparkWorker(workdir / f"worker-{index}", env_dir, self.master, blind_to)
            for index in range(workers)
        ]

    def start(self) -> Self:
        try:
            self.master.start()
            # Each worker is a JVM start of a few seconds: in parallel.
            with ThreadPoolExecutor(max_workers=len(self.workers) or 1) as pool:
                for started in [pool.submit(worker.start) for worker in self.workers]:
                    started.result()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()

    def completed_application(self, name: str) -> dict[str, Any]:
        """The master's record of the finished application called `name` (the last one)."""
        matches = [app for app in self.master.state()["completedapps"] if app["name"] == name]
        if not matches:
            raise LookupError(f"the master ran no application named {name!r}")
        return dict(matches[-1])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

"""A local server this program starts and stops itself: the shell shared by the broker and S3.

It runs in its own session with its output in a log file, is ready only when its subclass's
probe says so, and is stopped by the PIDs it started (and their descendants), never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Self

_STOP_GRACE_S = 10.0
_LOG_TAIL_CHARS = 4_000


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM to this process raises KeyboardInterrupt, as Ctrl-C does.

    Python's default SIGTERM ends the process without running `finally` blocks, which would
    leave the servers and streams a harness started running; this lets them stop theirs.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    except OSError as error:
        return f"<log {path} unreadable: {error}>"


def _stat_after_name(stat_path: Path) -> list[str]:
    """Fields 3 on of /proc/PID/stat: state, parent PID, ...

    The command name in field 2 may hold spaces and parentheses: the rest follows its last ')'.
    """
    return stat_path.read_text().rsplit(")", 1)[1].split()


def process_state(pid: int) -> str:
    """The one-letter state of a process, e.g. "T" when a signal stopped it."""
    return _stat_after_name(Path(f"/proc/{pid}/stat"))[0]


def parent_pid(pid: int) -> int:
    """The PID of `pid`'s parent; OSError if `pid` is gone."""
    return int(_stat_after_name(Path(f"/proc/{pid}/stat"))[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and of the children it has reaped, user and system, in seconds."""
    fields = _stat_after_name(Path(f"/proc/{pid}/stat"))
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the name.
    ticks = sum(int(field) for field in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> list[tuple[str, float]]:
    """(name, CPU seconds) of each live thread of `pid`, user and system; empty if it is gone."""
    threads = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = _stat_after_name(Path(f"/proc/{pid}/task/{tid}/stat"))
        except OSError:  # the thread ended between the listing and the read
            continue
        ticks = sum(int(field) for field in fields[11:13])  # utime, stime
        threads.append((name, ticks / os.sysconf("SC_CLK_TCK")))
    return threads


def rss_mib(pid: int) -> float:
    """Resident memory of `pid` in MiB; 0 for a process that is gone."""
    return _proc_kib_as_mib(pid, "status", "VmRSS:")


def pss_mib(pid: int) -> float:
    """`pid`'s proportional share of memory in MiB (each shared page divided among the processes
    mapping it); 0 for a process that is gone. Unlike RSS, it sums over a process tree: forked
    Python workers share their daemon's pages, which RSS counts once per worker."""
    return _proc_kib_as_mib(pid, "smaps_rollup", "Pss:")


def _proc_kib_as_mib(pid: int, file_name: str, field_name: str) -> float:
    """The `field_name` line (in kB) of `/proc/<pid>/<file_name>`, in MiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/{file_name}").read_text().splitlines():
            if line.startswith(field_name):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """PIDs of `pid`'s children, grandchildren, ... from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = parent_pid(int(entry.name))
        except OSError:
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


class LocalProcess:
    """Subclasses give `_launch()` a command and implement `_probe()`."""

    name = "server"
    """For messages: what runs."""
    ready_deadline_s = 30.0
    probe_interval_s = 0.1

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _launch(
        self, command: list[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        if self._process is not None:
            raise RuntimeError(f"{type(self).__name__} already started (pid {self.pid})")
        self._log_file = self.log_path.open("ab")
        self._process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own session, so a Ctrl-C aimed at the test run does not race our SIGTERM.
            start_new_session=True,
        )
        self.pid = self._process.pid
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _probe(self) -> None:
        """Return when the server answers as its users need; raise while it does not."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        """For messages: where it listens."""
        raise NotImplementedError

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.ready_deadline_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            exit_code = self._exit_code()
            if exit_code is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {exit_code} before it was ready "
                    f"({self.address}); log tail:\n{log_tail(self.log_path)}"
                )
            try:
                self._probe()
            except Exception as error:  # any failure means "not ready yet"
                last_error = error
            else:
                # Still alive: the answer came from our server, not one it lost a race to.
                if self._exit_code() is None:
                    return
            time.sleep(self.probe_interval_s)
        raise RuntimeError(
            f"{self.name} did not answer on {self.address} within {self.ready_deadline_s:.0f} s "
            f"(last error: {last_error!r}); log tail:\n{log_tail(self.log_path)}"
        )

    def _exit_code(self) -> int | None:
        assert self._process is not None
        return self._process.poll()

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL with `kill`), SIGKILL after 10 s; also to its children. Idempotent.

        Only PIDs this object started, or their descendants, are signalled.
        """
        process = self._process
        if process is not None:
            family = descendants(process.pid) if process.poll() is None else []
            if kill:
                process.kill()
            else:
                process.terminate()
            try:
                process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_GRACE_S)
            for pid in family:
                try:
                    # Still in the session we created: not a reused PID of another process.
                    if os.getpgid(pid) == process.pid:
                        os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._after_stop()
        self._process = None
        self.pid = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _after_stop(self) -> None:
        """Clean up what the stopped process leaves behind; nothing by default."""

    def restart(self) -> Self:
        """Stop, then start again with the same ports and data."""
        self.stop()
        return self.start()

    def start(self) -> Self:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

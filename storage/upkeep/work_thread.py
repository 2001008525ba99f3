"""Work in a thread of its own, and what it returned or raised, for the thread that waits for it:
a compaction beside the stream's batches, the next table's files while one commits, the stream's
Spark session while the stream is claimed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pyspark import InheritableThread

T = TypeVar("T")


class WorkThread(Generic[T]):
    """`work`, started at once in a daemon thread named `name`.

    With `spark_properties`, the starting thread's Spark local properties (the scheduler pool,
    the job group a stop cancels) follow the work into its thread (`InheritableThread`). Without,
    the thread starts with none: a stream's compaction must not inherit a micro-batch's."""

    def __init__(self, work: Callable[[], T], name: str, *, spark_properties: bool = False) -> None:
        self._returned: T | None = None
        self._error: BaseException | None = None
        thread_class = InheritableThread if spark_properties else threading.Thread
        self._thread = thread_class(target=self._run, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], T]) -> None:
        try:
            self._returned = work()
        except BaseException as error:  # raised again in the waiting thread, by `result`
            self._error = error

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> T:
        """Wait for the work to end; what it returned, or raise what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._returned  # type: ignore[return-value]  # set: the work returned

import threading

import pytest

from storage.upkeep.work_thread import WorkThread


def test_the_waiting_thread_gets_what_the_work_returned() -> None:
    started = threading.Event()
    release = threading.Event()

    def work() -> int:
        started.set()
        release.wait(10)
        return 42

    thread = WorkThread(work, "answer")
    assert started.wait(10)
    assert not thread.done
    release.set()
    assert thread.result() == 42
    assert thread.done


def test_the_waiting_thread_raises_what_the_work_raised() -> None:
    def work() -> int:
        raise ValueError("the lake is gone")

    thread = WorkThread(work, "failing")
    with pytest.raises(ValueError, match="the lake is gone"):
        thread.result()

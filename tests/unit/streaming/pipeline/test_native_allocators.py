"""A process the command line starts allocates as a long-lived process should: Arrow's C++ code
from the system's allocator, glibc with two arenas; and the processes it starts inherit both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streaming.pipeline.native_allocators import ALLOCATOR_ENV, MALLOC_ARENAS

_STARTED_BY_THE_COMMAND_LINE = """
import contextlib
from infra.cli.main import main

with contextlib.redirect_stdout(None), contextlib.suppress(SystemExit):
    main(["--help"])
"""

# What a stream's driver does after the command line starts: Parquet files, IPC streams, from
# threads that live at once (a compaction's); then what it looks like from inside.
_ALLOCATE_THEN_LOOK = """
import ctypes
import json
import os
import threading

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

rows = pa.table({"x": list(range(100_000)), "s": [str(i) for i in range(100_000)]})
pq.write_table(rows, PATH, compression="zstd")
pq.read_table(PATH)
sink = pa.BufferOutputStream()
with ipc.new_stream(sink, rows.schema, options=ipc.IpcWriteOptions(compression="zstd")) as out:
    out.write_table(rows)

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
all_started = threading.Barrier(8)


def allocate() -> None:
    libc.malloc(4096)  # a thread's first allocation: glibc gives it an arena if it may
    all_started.wait()


threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()

# glibc's own account of its arenas: a <heap nr="..."> element each.
text = ctypes.c_char_p()
size = ctypes.c_size_t()
libc.open_memstream.restype = ctypes.c_void_p
stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(text), ctypes.byref(size)))
libc.malloc_info(0, stream)
libc.fclose(stream)
arenas = ctypes.string_at(text, size.value).decode().count("<heap nr=")
print(json.dumps({
    "mimalloc_allocations": pa.mimalloc_memory_pool().num_allocations(),
    "arenas": arenas,
    "environ": {name: os.environ.get(name) for name in ENVIRON},
}))
"""


def _look(tmp_path: Path, before: str) -> dict[str, object]:
    environ = {name: value for name, value in os.environ.items() if name not in ALLOCATOR_ENV}
    program = (
        f"{before}\nPATH = {str(tmp_path / 'rows.parquet')!r}\nENVIRON = {list(ALLOCATOR_ENV)!r}\n"
        f"{_ALLOCATE_THEN_LOOK}"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=environ, capture_output=True, text=True, check=True
    )
    looked: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return looked


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_a_process_the_command_line_starts_uses_the_system_allocator_with_two_arenas(
    tmp_path: Path,
) -> None:
    looked = _look(tmp_path, _STARTED_BY_THE_COMMAND_LINE)
    assert looked["mimalloc_allocations"] == 0
    assert looked["arenas"] <= MALLOC_ARENAS
    assert looked["environ"] == ALLOCATOR_ENV  # what the JVM and its workers start with


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_without_it_arrow_allocates_from_its_own_pool_and_each_thread_gets_an_arena(
    tmp_path: Path,
) -> None:
    """Why the allocators are chosen where the process starts: `set_memory_pool` later leaves
    Arrow's C++ code on the pool it picked at its first allocation."""
    switched_late = """
import pyarrow as pa

pa.array([1, 2, 3])
pa.set_memory_pool(pa.system_memory_pool())
"""
    looked = _look(tmp_path, switched_late)
    assert looked["arenas"] > MALLOC_ARENAS
    if looked["mimalloc_allocations"] == 0:
        pytest.skip("this pyarrow's default pool is not mimalloc: nothing to switch from")

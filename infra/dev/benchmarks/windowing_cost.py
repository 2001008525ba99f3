"""Cost of `key_windows.advance` per record as the open windows of one key pile up.

    .venv/bin/python -m infra.dev.benchmarks.windowing_cost [--sizes 1000,5000,10000,20000]

For tumbling (1 s), sliding (10 s every 1 s) and session (1 s gap) windows it feeds N records,
mostly in event-time order and some late, into one key in micro-batches, with an allowed
lateness of a day so that every window stays open: after N records about N windows are open.
It prints microseconds per record for the current code and for a baseline, measured in the same
process on the same records: the baseline is
`streaming/windowing.py` (one module then) as of `--baseline-ref`
(by default the commit before the open-window index), written out with `git show` into a temp
dir and imported from there. Both must emit the same panes, or the run stops. Times are this
process's CPU time, so other jobs on a shared machine disturb them less than the wall clock,
and each run starts with the garbage collector's generations emptied and earlier objects
frozen, so that no run pays for collecting what an earlier one left behind.

A second table shows what a micro-batch costs when the state is kept as JSON between batches,
as the stateful stage does: loading and saving the state, and rebuilding the open-window index that
is not serialized (an empty `advance` on a freshly loaded state), all O(open windows).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from streaming.windowing import key_state, key_windows
from tenants.models import WindowRules

# Today's code in the one-module shape the baseline has.
CURRENT = SimpleNamespace(
    KeyState=key_state.KeyState, RecordInput=key_state.RecordInput, advance=key_windows.advance
)

# The last commit before `_OpenWindowIndex`: its `advance` scans every open window.
DEFAULT_BASELINE_REF = "f4114c53fd83f980ec3a823404e45b1268f3da28"
DAY_MS = 86_400_000

WINDOW_KINDS: dict[str, tuple[dict[str, Any], int]] = {
    # kind: (window spec, event-time step between consecutive in-order records)
    "tumbling": ({"kind": "tumbling", "size": 1_000}, 1_000),
    "sliding": ({"kind": "sliding", "size": 10_000, "slide": 1_000}, 1_000),
    "session": ({"kind": "session", "gap": 1_000}, 2_000),
}


@dataclass(frozen=True)
class Run:
    seconds: float
    open_windows: int
    panes: int


def rules_for(kind: str) -> WindowRules:
    window, _ = WINDOW_KINDS[kind]
    return WindowRules.model_validate(
        {
            "window": window,
            "out_of_orderness": 5_000,
            "allowed_lateness": DAY_MS,
            "metrics": {"amount": {"kind": "sum", "field": "amount"}},
        }
    )


def event_times(kind: str, count: int, seed: int) -> list[int]:
    """In order, one step apart, except 5 % that arrive up to 60 steps late."""
    _, step_ms = WINDOW_KINDS[kind]
    rng = random.Random(seed)
    times: list[int] = []
    for index in range(count):
        late_by = (
            rng.randint(1, 60) * step_ms + rng.randint(0, step_ms) if rng.random() < 0.05 else 0
        )
        times.append(max(0, index * step_ms - late_by))
    return times


def feed(
    module: ModuleType | SimpleNamespace, rules: WindowRules, times: list[int], batch_size: int
) -> tuple[Run, Any]:
    """All records into one fresh key, batch by batch, the state kept in memory."""
    gc.collect()
    gc.freeze()
    state = module.KeyState()
    panes = 0
    started = time.process_time()
    for first in range(0, len(times), batch_size):
        batch = [module.RecordInput(t, {"amount": 1.0}) for t in times[first : first + batch_size]]
        panes += len(module.advance(state, batch, rules).panes)
    seconds = time.process_time() - started
    gc.unfreeze()
    return Run(seconds, len(state.windows), panes), state


def timed_ms(action: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        action()
        best = min(best, time.process_time() - started)
    return best * 1000


def json_batch_costs(state: key_state.KeyState, rules: WindowRules) -> tuple[float, float, float]:
    """Milliseconds to load the state from JSON, rebuild its index, and save it again."""
    text = json.dumps(state.to_json_dict(), separators=(",", ":"))

    def load() -> key_state.KeyState:
        return key_state.KeyState.from_json_dict(json.loads(text))

    def rebuild() -> None:
        loaded = load()
        started = time.process_time()
        key_windows.advance(loaded, [], rules)
        rebuild_seconds.append(time.process_time() - started)

    rebuild_seconds: list[float] = []
    load_ms = timed_ms(load)
    timed_ms(rebuild)
    save_ms = timed_ms(lambda: json.dumps(state.to_json_dict(), separators=(",", ":")))
    return load_ms, min(rebuild_seconds) * 1000, save_ms


def load_baseline(ref: str, directory: Path) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{ref}:streaming/windowing.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = directory / "windowing_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("windowing_baseline", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is executed
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,5000,10000,20000")
    parser.add_argument("--kinds", default=",".join(WINDOW_KINDS))
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--baseline-ref", default=DEFAULT_BASELINE_REF)
    parser.add_argument("--no-baseline", action="store_true", help="measure the current code only")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    kinds = args.kinds.split(",")

    with tempfile.TemporaryDirectory(prefix="tw-windowing-baseline-") as directory:
        baseline = None if args.no_baseline else load_baseline(args.baseline_ref, Path(directory))
        print(
            f"one key, records in batches of {args.batch_size}, allowed_lateness 1 day, "
            "out_of_orderness 5 s, 5 % of records up to 60 windows late"
        )
        if baseline is not None:
            print(f"baseline: streaming/windowing.py at {args.baseline_ref[:12]}, same process")
        print(
            f"{'kind':<9}{'records':>8}{'open windows':>14}"
            f"{'baseline us/rec':>17}{'current us/rec':>16}{'speed-up':>10}"
        )
        json_costs: list[tuple[str, int, tuple[float, float, float]]] = []
        for kind in kinds:
            rules = rules_for(kind)
            for size in sizes:
                times = event_times(kind, size, args.seed)
                current, state = feed(CURRENT, rules, times, args.batch_size)
                json_costs.append((kind, size, json_batch_costs(state, rules)))
                del state
                baseline_cell, speed_up_cell = "-", "-"
                if baseline is not None:
                    before, _ = feed(baseline, rules, times, args.batch_size)
                    if (before.open_windows, before.panes) != (current.open_windows, current.panes):
                        raise SystemExit(f"{kind} x {size}: baseline and current code disagree")
                    baseline_cell = f"{before.seconds / size * 1e6:.1f}"
                    speed_up_cell = f"{before.seconds / current.seconds:.1f}x"
                print(
                    f"{kind:<9}{size:>8}{current.open_windows:>14}"
                    f"{baseline_cell:>17}{current.seconds / size * 1e6:>16.1f}{speed_up_cell:>10}",
                    flush=True,
                )

    print("\nper micro-batch with the state kept as JSON (current code), at the open windows above")
    print(f"{'kind':<9}{'records':>8}{'load ms':>10}{'index rebuild ms':>18}{'save ms':>10}")
    for kind, size, (load_ms, rebuild_ms, save_ms) in json_costs:
        print(f"{kind:<9}{size:>8}{load_ms:>10.1f}{rebuild_ms:>18.1f}{save_ms:>10.1f}")


if __name__ == "__main__":
    main()

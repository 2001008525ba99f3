"""Closing a key whose config is gone: every open window gets its final pane now (contract §6).

Pure, no Spark. The key's rules are gone from the tenant config by then, but each open window
kept the rules it was opened with (`KeyState.rules`), which is all a final pane needs: the
accumulation mode, the emit mode and the metrics.

The watermark does not move: the windows close because the key left, not because event time
passed their end. So a final pane fired here is told apart from one fired by the watermark by
`watermark < window_end + allowed_lateness`, and by the key's `tenant_status` row that says
`offboarded`.
"""

from __future__ import annotations

from streaming.windowing.key_state import KeyState, Timing
from streaming.windowing.key_windows import Pane
from tenants.models import Accumulation, Emit, WindowRules


def close_all_windows(state: KeyState) -> list[Pane]:
    """The final pane of every open window of `state`, by window start; the windows are dropped.

    Each pane is what the window's next pane would have held, marked final:
    - `every_pane`: `pane_index` is the window's next index; `timing` is ON_TIME while W has
      not reached the window's end (its records all arrived before that), LATE after it; the
      count and metrics follow the window's accumulation mode, so a discarding window whose
      records were all emitted already gets a final pane with count 0, as one closed by the
      watermark does.
    - `final_only`: the window's only row, its totals as pane 0, LATE if any record was late.
    """
    rules_by_id = {
        rules_id: WindowRules.model_validate(body) for rules_id, body in state.rules.items()
    }
    panes: list[Pane] = []
    for window in sorted(state.windows.values(), key=lambda w: (w.start_ms, w.end_ms)):
        rules = rules_by_id[window.rules_id]
        if rules.emit is Emit.FINAL_ONLY:
            pane_index, shown = 0, window.total
            timing = Timing.LATE if window.had_late_records else Timing.ON_TIME
        else:
            pane_index = window.next_pane_index
            accumulating = rules.accumulation is Accumulation.ACCUMULATING
            shown = window.total if accumulating else window.pending
            timing = Timing.LATE if window.on_time_sealed else Timing.ON_TIME
        panes.append(
            Pane(
                window_id=window.window_id,
                window_start_ms=window.start_ms,
                window_end_ms=window.end_ms,
                pane_index=pane_index,
                timing=timing,
                is_final=True,
                count=shown.count,
                metrics=shown.results(rules.metrics),
                watermark_ms=state.watermark_ms,
                merged_window_ids=tuple(window.merged_window_ids),
            )
        )
    state.windows = {}
    state.rules = {}
    state.open_window_index = None
    return panes

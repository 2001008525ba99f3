"""When a compaction settles every staged row and when it only merges (`SettlePolicy`), from the
staged files' staging times and the timestamp of the batch it runs after
(`storage.upkeep.compaction` says what each does)."""

from __future__ import annotations

from dataclasses import dataclass

from storage.lake.delta_lake import LakeFile
from storage.lake.file_names import run_oldest_ms


@dataclass(frozen=True)
class SettlePolicy:
    """When staged rows settle: `stream.compact_interval`, `merge_interval`, `settle_rows`."""

    age_limit_ms: int = 0
    """No staged row waits longer than this (plus one batch) to settle; 0: every compaction
    settles everything."""
    pass_interval_ms: int = 0
    """How often compaction runs (at most `age_limit_ms`)."""
    settle_rows: int = 1
    """A key with this many rows among a merge's inputs settles them."""

    @classmethod
    def of(cls, age_limit_ms: int, merge_interval_ms: int, settle_rows: int) -> SettlePolicy:
        return cls(age_limit_ms, min(merge_interval_ms, age_limit_ms), settle_rows)

    def settles_all(self, staged: list[LakeFile], now_ms: int | None) -> bool:
        """Whether a compaction at `now_ms` (None: the stream's last one, as an
        `--available-now` run ends) settles every staged row, or only merges: the oldest row
        would be older than the age limit by the next compaction, `pass_interval_ms` later."""
        if now_ms is None or self.age_limit_ms <= self.pass_interval_ms:
            return True
        oldest_ms = min(file.staged_ms or 0 for file in staged)
        return oldest_ms <= now_ms - (self.age_limit_ms - self.pass_interval_ms)

    def owes(self, staged: list[LakeFile], now_ms: int) -> bool:
        """Whether a compaction at `now_ms` has work that one at the start of its interval
        would have done: a staged file from before the interval began that it takes (a run only
        when it settles everything). A stream that died before its interval's compaction
        committed owes it."""
        began_ms = now_ms - now_ms % self.pass_interval_ms if self.pass_interval_ms else now_ms
        takes_runs = bool(staged) and self.settles_all(staged, now_ms)
        return any(
            (file.staged_ms or 0) < began_ms and (takes_runs or run_oldest_ms(file.path) is None)
            for file in staged
        )


SETTLE_EVERYTHING = SettlePolicy()

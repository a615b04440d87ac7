"""Iteration timings kept by the training loop itself: two ``perf_counter`` readings and one
list append per iteration, inline, with no hook call (a Python frame costs about a
microsecond, a few percent of a small model's step). The timer plugin reads them; the loop
takes them only once a reader has asked (:meth:`IterationClock.keep`), so a run without one
pays nothing for them.

An iteration's *period* runs from the end of the previous iteration's step to the end of its
own (before its ``after_train_iter`` hooks, so a checkpoint saved there counts it); reports
and validation passes in between are cut out. Its *data time* is the wait for the batch
after the previous iteration's hooks.
"""

from __future__ import annotations

import time
from collections import deque


class IterationClock:
    """Timings of this process's current ``train()`` call.

    ``pending`` collects ``(period, data seconds, samples)`` per iteration and is folded
    into the totals and the ``recent`` window whenever someone reads (and at every report,
    so it stays short)."""

    def __init__(self, window: int = 100) -> None:
        self.pending: list[tuple[float, float, int]] = []
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=window)
        self.warmup = 0  # iterations left out of the timed totals (the timer sets it)
        self.recording = False  # whether the loop records iterations: someone reads them
        # under torch.distributed: the slowest rank's mean data time over the last report
        # interval, set at each report point (None before the first, and in one process)
        self.slowest_data_time: float | None = None
        self.start()

    def start(self) -> None:
        """A new ``train()`` call: totals from zero."""
        self.pending.clear()
        self.recent.clear()
        self.iters = self.timed_iters = 0
        self.seconds = self.timed_seconds = 0.0
        self.interval = (0, 0.0)  # (iterations, data seconds) since the last take_data_time
        self.slowest_data_time = None
        self.val_passes, self.val_seconds = 0, 0.0  # validation passes inside training

    def training_time(self) -> float:
        """``perf_counter`` less the validation passes inside training so far: the difference
        of two readings is the seconds trained between them (one taken during a validation
        counts it until it ends)."""
        return time.perf_counter() - self.val_seconds

    def validated(self, seconds: float) -> None:
        """A validation pass of the training loop took ``seconds`` (cut out of the periods)."""
        self.val_passes += 1
        self.val_seconds += seconds

    def fold(self) -> None:
        """Move the pending iterations into the totals and the window."""
        pending = self.pending
        if pending:
            skip = max(0, self.warmup - self.iters)
            timed = pending[skip:]
            periods, waits, _ = zip(*pending, strict=True)
            self.timed_iters += len(timed)
            self.timed_seconds += sum(periods[skip:])
            self.iters += len(pending)
            self.seconds += sum(periods)
            self.recent.extend(timed)
            iters, data = self.interval
            self.interval = (iters + len(pending), data + sum(waits))
            pending.clear()

    def take_data_time(self) -> float:
        """Mean data seconds per iteration since the previous call (0.0 without iterations);
        starts the next interval."""
        self.fold()
        iters, data = self.interval
        self.interval = (0, 0.0)
        return data / iters if iters else 0.0

    def keep(self, size: int) -> None:
        """Keep at least the last ``size`` iterations in the window; the loop records
        iterations from the first call on (a reader of the clock calls it before training)."""
        self.recording = True
        if size > (self.recent.maxlen or 0):
            self.recent = deque(self.recent, maxlen=size)

    def window_totals(self, size: int) -> tuple[int, float, float, int]:
        """Over the last ``size`` iterations past warm-up: their number, seconds, data
        seconds and samples."""
        window = self.window(size)
        if not window:
            return 0, 0.0, 0.0, 0
        periods, waits, samples = zip(*window, strict=True)
        return len(window), sum(periods), sum(waits), sum(samples)

    def window(self, size: int) -> list[tuple[float, float, int]]:
        """The last ``size`` iterations past warm-up: ``(period, data seconds, samples)``,
        oldest first."""
        self.fold()
        recent = self.recent
        return list(recent)[-size:] if size < len(recent) else list(recent)

"""The time spent in hook calls, kept apart from the dispatcher that fills it: the runner's
protocol exposes it (``runner.hook_stats``) without importing the dispatcher, which
imports the hookspecs that type that protocol."""

from __future__ import annotations


class HookStats:
    """Time spent inside hook calls: a total always, per plugin and hook when profiling."""

    def __init__(self) -> None:
        self.total = 0.0
        """Seconds spent in hook calls during the run."""
        self.profile = False
        """Whether ``per_hook`` is filled (the timer's hook table turns it on)."""
        self.per_hook: dict[tuple[str, str], list[float]] = {}
        """(plugin, hook point) to [calls, seconds], while ``profile`` is true."""

    def record(self, owner: str, hook: str, seconds: float, calls: int = 1) -> None:
        """Add one call's time; a wrapper's part after its ``yield`` adds time, not a call."""
        entry = self.per_hook.get((owner, hook))
        if entry is None:
            entry = self.per_hook[(owner, hook)] = [0, 0.0]
        entry[0] += calls
        entry[1] += seconds

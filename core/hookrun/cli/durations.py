"""Durations as ``H:MM:SS``, one format for every console line (ETA, elapsed, totals)."""

from __future__ import annotations

import math


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` with hours unbounded (``26:03:09``, not ``1 day, 2:03:09``); negative
    durations show as ``0:00:00`` and unknown (NaN, infinite) ones as ``-:--:--``."""
    if not math.isfinite(seconds):
        return "-:--:--"
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"

"""Durations and numbers as every console line shows them: the report lines, the progress
bar, the validation lines and the final table use these, so one value reads the same
everywhere."""

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


def format_number(value: float) -> str:
    """Four significant digits from 0.001 to 10000 (a loss of 0.03671, not ``0.0367``),
    whole numbers up to ten million (``2994``, not ``2994.4300``), scientific notation
    beyond (a loss of 1e-5 is ``1.000e-05``, never ``0.0000``); NaN and infinities as
    Python prints them."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(float(value))
    size = abs(value)
    if 1e-3 <= size < 1e4:
        text = f"{value:.4g}"
        if "e" not in text:  # 9999.9 rounds to 1e+04: shown whole below
            return text
        size = 1e4
    if 1e4 <= size < 1e7:
        return f"{value:.0f}"
    return f"{value:.3e}"


def format_scalar(name: str, value: float) -> str:
    """A scalar the core reports, with its unit: ``train/time`` and ``train/data_time``
    (seconds per iteration) in ms, ``train/throughput`` in samples/s, ``train/memory`` in
    MiB, ``train/eta`` as a duration, learning rates (``train/lr*``) in scientific notation
    (they span decades); any other name as :func:`format_number`."""
    if name in ("train/time", "train/data_time"):
        return f"{format_number(value * 1000)} ms"
    if name == "train/throughput":
        return f"{format_number(value)} samples/s"
    if name == "train/memory":
        return f"{value:.0f} MiB"
    if name == "train/eta":
        return format_duration(value)
    if name.startswith("train/lr"):
        return f"{value:.3e}"
    return format_number(value)

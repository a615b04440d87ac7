"""hookrun-timer: data time, iteration time, throughput, totals and time spent in hooks.

The host clocks are the core's (``runner.clock``: two ``perf_counter`` readings per
iteration inside the training loop), so on CPU the timer calls no per-iteration hook at all
and never synchronises with the device. On CUDA the iteration time and throughput come from
CUDA events recorded every iteration and read lazily: the value put into ``runner.scalars``
is an object whose ``float()`` waits for the newest event, so the one synchronisation happens
when the core reads its report, never in between. The values are the store's *gauges*: a
report writes their current value. (The ETA is the core's.)

An iteration's *period* and *data time* are the core clock's (see ``hookrun.engine.clock``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import Field
from rich.table import Table

from hookrun import (
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    format_duration,
    format_scalar,
    hookimpl,
)

__all__ = ["Timer", "TimerSettings"]

TOTAL_KEYS = (
    "elapsed",  # wall time of train(), validation passes included
    "iters",
    "seconds",  # sum of every iteration's period
    "timed_iters",  # iterations past warm-up
    "timed_seconds",
    "hooks",  # time inside hook calls
    "val_passes",
    "val_seconds",
)


class TimerSettings(PluginSettings):
    """Settings of the ``timer`` plugin."""

    warmup: int = Field(
        5,
        ge=0,
        description="The first `warmup` iterations of each process (start-up, caches, "
        "compilation) are left out of every average and the overall speed.",
    )
    window: int = Field(
        20,
        ge=1,
        description="`train/time`, `train/data_time` and `train/throughput` are means over the "
        "last `window` iterations.",
    )
    profile_hooks: bool = Field(
        False,
        description="Time every plugin at every hook point and print a table of calls, total "
        "and mean time at the end of the run; the table also goes to the JSONL log as a "
        "`hook_profile` record. Costs up to about 1 µs per plugin per hook call.",
    )
    cuda_events: Literal["auto"] | bool = Field(
        "auto",
        description="Measure iteration time and throughput with CUDA events (read only when "
        "the core reads its report) instead of host clocks: `auto` uses them on a CUDA device; "
        "`true` requires one.",
    )


class Timer(Plugin[TimerSettings]):
    """Per-iteration timings into ``runner.scalars`` and a speed summary at the end of training."""

    name = "timer"
    Settings = TimerSettings
    priority = Priority.HIGH  # its clocks run before, and so around, lower-priority plugins
    enabled_by_default = True

    def __init__(self, settings: TimerSettings | None = None) -> None:
        super().__init__(settings)
        self.totals: dict[str, float] = dict.fromkeys(TOTAL_KEYS, 0.0)  # earlier segments
        self.profile_rows: dict[tuple[str, str], list[float]] = {}  # earlier segments
        self.segment: Segment | None = None
        self.profile_was = False  # the core's profiling switch before this run turned it on

    @hookimpl
    def before_run(self, runner: RunnerProtocol) -> None:
        if runner.mode != "train":
            return
        use_events = self.settings.cuda_events
        if use_events is True and runner.device.type != "cuda":
            raise ConfigError(
                f"plugins.timer.cuda_events: true needs a CUDA device (runner.device is "
                f"{runner.device})"
            )
        use_events = runner.device.type == "cuda" and use_events is not False
        stats = runner.hook_stats
        self.profile_was = stats.profile
        if self.settings.profile_hooks:
            stats.profile = True
        segment = self.segment = Segment(runner, self.settings, use_events)
        deferred = {  # live gauges: each computes the current window when read (NaN: empty)
            "train/time": Deferred(lambda: float(segment.speed()[0])),
            "train/data_time": Deferred(segment.data_time),
            "train/throughput": Deferred(lambda: float(segment.speed()[1])),
        }
        if runner.world_size > 1:  # the core measures it at every report point
            clock = runner.clock
            deferred["train/data_time_max"] = Deferred(
                lambda: math.nan if clock.slowest_data_time is None else clock.slowest_data_time
            )
        for name, value in deferred.items():
            runner.scalars.gauge(name, value)

    def unused_hooks(self, runner: RunnerProtocol) -> set[str]:
        """Per-iteration work and validation's end matter only to CUDA events."""
        return set() if self.events_wanted(runner) else {"after_train_iter", "after_val"}

    def events_wanted(self, runner: RunnerProtocol) -> bool:
        wanted = self.settings.cuda_events
        return wanted is True or (wanted == "auto" and runner.device.type == "cuda")

    @hookimpl
    def before_train(self) -> None:
        if self.segment is not None:
            self.segment.start_training()

    @hookimpl
    def after_train_iter(self) -> None:
        if self.segment is not None:
            self.segment.iteration_done()

    @hookimpl
    def after_val(self) -> None:
        """CUDA events: the next iteration's period starts after validation."""
        if self.segment is not None and self.segment.training:
            self.segment.restart_events()

    @hookimpl
    def after_train(self) -> None:
        if self.segment is not None:
            self.segment.training = False

    @hookimpl
    def after_run(self, runner: RunnerProtocol) -> None:
        if self.segment is not None:
            self.close_segment(runner)
            if runner.is_main:
                self.report(runner)

    @hookimpl
    def on_exception(self, runner: RunnerProtocol) -> None:
        """Keep the totals so far (an emergency checkpoint saves them) and stop profiling."""
        if self.segment is not None:
            self.close_segment(runner)

    def close_segment(self, runner: RunnerProtocol) -> None:
        self.totals = self.current_totals()
        self.profile_rows = self.current_profile()
        self.segment = None
        runner.hook_stats.profile = self.profile_was

    def state_dict(self) -> dict[str, Any]:
        """Totals up to now (this process's running segment included), for resumed runs."""
        profile = [[p, h, c, s] for (p, h), (c, s) in self.current_profile().items()]
        return {"totals": self.current_totals(), "hook_profile": profile}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals = {k: float(state["totals"].get(k, 0.0)) for k in TOTAL_KEYS}
        self.profile_rows = {(p, h): [c, s] for p, h, c, s in state.get("hook_profile", [])}

    # -- figures -------------------------------------------------------------------------

    def current_totals(self) -> dict[str, float]:
        totals = dict(self.totals)
        if self.segment is not None:
            for key, value in self.segment.totals().items():
                totals[key] += value
        return totals

    def current_profile(self) -> dict[tuple[str, str], list[float]]:
        """Calls and seconds per (plugin, hook point), earlier segments included."""
        rows = {key: list(value) for key, value in self.profile_rows.items()}
        if self.segment is not None:
            for key, (calls, seconds) in self.segment.stats.per_hook.items():
                calls_before, seconds_before = self.segment.profile_start.get(key, (0, 0.0))
                row = rows.setdefault(key, [0, 0.0])
                row[0] += calls - calls_before
                row[1] += seconds - seconds_before
        return {key: row for key, row in rows.items() if row[0] > 0}

    def report(self, runner: RunnerProtocol) -> None:
        """The summary lines, and with ``profile_hooks`` the table (console and JSONL log)."""
        t = self.totals
        iters, seconds = t["timed_iters"], t["timed_seconds"]
        if not iters:  # the whole run was warm-up: report every iteration instead
            iters, seconds = t["iters"], t["seconds"]
        per_iter = "no iterations"
        if iters:
            per_iter = f"{format_scalar('train/time', seconds / iters)}/it"
        took, hooks = format_duration(seconds), format_duration(t["hooks"])
        runner.info(f"Overall training speed: {int(iters)} iterations in {took} ({per_iter})")
        runner.info(f"Total training time: {format_duration(t['elapsed'])} ({hooks} on hooks)")
        steps = runner.position.optimizer_steps  # the core's count, resumed runs included
        if len(steps) > 1:
            rates = [
                f"{name} {count}" + (f" ({count / t['seconds']:.1f}/s)" if t["seconds"] else "")
                for name, count in steps.items()
            ]
            runner.info(f"Optimizer steps: {', '.join(rates)}")
        if self.settings.profile_hooks:
            rows = profile_records(self.profile_rows)
            runner.console.print(profile_table(rows))
            for writer in runner.writers:
                writer.write_record({"hook_profile": rows, "step": runner.iter})


class Segment:
    """The clocks of one ``train()`` call in one process (a resumed run starts a new one)."""

    def __init__(self, runner: RunnerProtocol, settings: TimerSettings, use_events: bool) -> None:
        now = time.perf_counter()
        self.stats = runner.hook_stats
        self.start = now
        self.hooks_start = self.stats.total
        self.profile_start = {k: tuple(v) for k, v in self.stats.per_hook.items()}
        self.clock = runner.clock
        self.clock.warmup = settings.warmup
        self.clock.keep(settings.window)
        self.size = settings.window
        self.warmup = settings.warmup
        self.events: deque[tuple[Any, Any, int]] | None = (
            deque(maxlen=settings.window) if use_events else None
        )
        self.last_event: Any = None
        self._measured: tuple[tuple[Any, Any], float] = ((math.nan, math.nan), math.nan)
        self._measured_at = -1  # the clock's iterations when last measured
        self.training = False
        self.iters = 0  # iterations seen by after_train_iter (CUDA events)

    def start_training(self) -> None:
        self.training = True
        if self.events is not None:
            self.last_event = record_event()

    def iteration_done(self) -> None:
        """CUDA events only: one recorded per iteration, its samples from the core clock."""
        self.iters += 1
        if self.events is not None:
            end_event = record_event()
            if self.iters > self.warmup:
                pending, recent = self.clock.pending, self.clock.recent
                latest = pending[-1] if pending else recent[-1] if recent else (0, 0, 0)
                self.events.append((self.last_event, end_event, latest[2]))
            self.last_event = end_event

    def speed(self) -> tuple[Any, Any]:
        """Seconds per iteration and samples/s over the window (:meth:`_measure`)."""
        return self._measure()[0]

    def data_time(self) -> float:
        """Mean data seconds per iteration over the window (NaN while it is empty)."""
        return self._measure()[1]

    def _measure(self) -> tuple[tuple[Any, Any], float]:
        """The window's speed and data time, summed once per report however often they are
        read; with CUDA events the speed is two lazy values sharing one measurement."""
        clock = self.clock
        clock.fold()
        if self._measured_at != clock.iters:
            iters, seconds, waits, samples = clock.window_totals(self.size)
            speed: tuple[Any, Any] = (math.nan, math.nan)
            if self.events:
                measured = EventWindow(tuple(self.events))
                speed = Lazy(measured, "seconds"), Lazy(measured, "throughput")
            elif iters:
                speed = seconds / iters, samples / seconds if seconds > 0 else 0.0
            self._measured = speed, waits / iters if iters else math.nan
            self._measured_at = clock.iters
        return self._measured

    def restart_events(self) -> None:
        if self.events is not None:
            self.last_event = record_event()

    def totals(self) -> dict[str, float]:
        clock = self.clock
        clock.fold()
        return {
            "elapsed": time.perf_counter() - self.start,
            "iters": clock.iters,
            "seconds": clock.seconds,
            "timed_iters": clock.timed_iters,
            "timed_seconds": clock.timed_seconds,
            "hooks": self.stats.total - self.hooks_start,
            "val_passes": clock.val_passes,
            "val_seconds": clock.val_seconds,
        }


class EventWindow:
    """Iteration periods between CUDA events; measured once, on first read (one sync)."""

    def __init__(self, pairs: tuple[tuple[Any, Any, int], ...]) -> None:
        self.pairs = pairs
        self.measured: tuple[float, int] | None = None

    def measure(self) -> tuple[float, int]:
        if self.measured is None:
            self.pairs[-1][1].synchronize()
            seconds = sum(start.elapsed_time(end) for start, end, _ in self.pairs) / 1000.0
            self.measured = (seconds, sum(samples for _, _, samples in self.pairs))
        return self.measured

    def seconds(self) -> float:
        seconds, _ = self.measure()
        return seconds / len(self.pairs)

    def throughput(self) -> float:
        seconds, samples = self.measure()
        return samples / seconds if seconds > 0 else 0.0


class Deferred:
    """A scalar computed only when ``float()`` is called on it (``ScalarStore`` does so)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], float]) -> None:
        self.compute = compute

    def __float__(self) -> float:
        return float(self.compute())


class Lazy:
    """A scalar read only when ``float()`` is called on it (``ScalarStore`` does so)."""

    __slots__ = ("window", "what")

    def __init__(self, window: EventWindow, what: str) -> None:
        self.window = window
        self.what = what

    def __float__(self) -> float:
        return float(getattr(self.window, self.what)())


def record_event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def profile_records(rows: dict[tuple[str, str], list[float]]) -> list[dict[str, Any]]:
    """Rows of the hook profile, slowest first: plugin, hook, calls, total and mean seconds."""
    out = [
        {
            "plugin": plugin,
            "hook": hook,
            "calls": int(calls),
            "total_s": seconds,
            "mean_us": seconds / calls * 1e6,
        }
        for (plugin, hook), (calls, seconds) in rows.items()
        if calls
    ]
    return sorted(out, key=lambda row: -row["total_s"])


def profile_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Time in hooks (per plugin and hook point)")
    for column in ("plugin", "hook", "calls", "total", "mean"):
        table.add_column(column, justify="left" if column in ("plugin", "hook") else "right")
    for row in rows:
        table.add_row(
            row["plugin"],
            row["hook"],
            str(row["calls"]),
            f"{row['total_s']:.4f} s",
            f"{row['mean_us']:.1f} µs",
        )
    return table

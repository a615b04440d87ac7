"""hookrun-logger: the console view of a run: a progress bar or plain lines, one line per
validation and test.

The core reports training scalars to every writer (``runner.log_interval``); this plugin
only renders those reports (``after_report``), so between reports it costs nothing and the
writers get every scalar without it. The progress bar is redrawn by rich's own thread on a
clock. The lines themselves are the core's (``hookrun.report_line``, ``hookrun.metrics_line``),
so a run without this plugin prints the same ones.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator, Sized
from typing import Any, Literal

from pydantic import Field
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from hookrun import (
    ConfigError,
    Pace,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    epoch_label,
    format_number,
    format_scalar,
    hookimpl,
    metrics_line,
    report_line,
    write_line,
)

__all__ = ["Logger", "LoggerSettings"]


class LoggerSettings(PluginSettings):
    """Settings of the ``logger`` plugin."""

    interval: int | None = Field(
        None,
        ge=1,
        description="In `lines` mode, print a line every `interval` iterations and after "
        "the last one, at the core's reports (`runner.log_interval` must divide it; in a "
        "config file it defaults to this interval); `null`: every `runner.log_interval` "
        "iterations. Also the batch interval of "
        "`log_val_iters` lines.",
    )
    progress: Literal["auto", "bar", "lines", "off"] = Field(
        "auto",
        description="Console display: `bar` (a rich progress bar redrawn on a clock), `lines` "
        "(one plain line every `interval` iterations), `off`, or `auto` (bar on a terminal, "
        "lines otherwise).",
    )
    refresh_per_second: float = Field(
        4.0, gt=0, le=60, description="How many times per second the progress bar is redrawn."
    )
    log_val_iters: bool = Field(
        False,
        description="Also show validation/test progress: a second bar row, or a line every "
        "`interval` batches in `lines` mode.",
    )


class Logger(Plugin[LoggerSettings]):
    """Console progress: a bar or a line every ``interval`` iterations, a line per
    validation and test."""

    name = "logger"
    Settings = LoggerSettings
    priority = Priority.BELOW_NORMAL
    enabled_by_default = True
    report_interval_setting = "interval"  # runner.log_interval defaults to it
    renders_console = True  # the core prints no lines of its own

    def __init__(self, settings: LoggerSettings | None = None) -> None:
        super().__init__(settings)
        self.display = "off"
        self.every = 1  # console lines every `every` iterations
        self.view: ProgressView | None = None
        self.live: Live | None = None
        self.pace: Pace | None = None  # the speed between lines (training)
        self._eval: list[Any] | None = None  # [mode, batches done, total, clock] during val/test

    @hookimpl
    def before_run(self, runner: RunnerProtocol) -> None:
        every = self.settings.interval or runner.log_interval
        if every % runner.log_interval:
            raise ConfigError(
                f"plugins.logger.interval: {every} is not a multiple of runner.log_interval "
                f"({runner.log_interval}); lines can only be printed at the core's reports"
            )
        self.every = every
        if not runner.is_main:
            self.display = "off"
            return
        self.display = resolve_display(self.settings.progress, runner.console)
        if self.display == "bar" and (runner.mode == "train" or self.settings.log_val_iters):
            self.view = ProgressView(runner, self)
            self.live = Live(
                self.view,
                console=runner.console,
                refresh_per_second=self.settings.refresh_per_second,
            )
            self.live.start()

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        self.pace = Pace(runner.clock)
        self.pace.start(runner.iter)
        if self.view is not None:
            self.view.start_training()

    @hookimpl
    def after_report(self, runner: RunnerProtocol, scalars: dict[str, float], step: int) -> None:
        if self.view is not None:
            self.view.new_values(scalars, time.perf_counter())
        elif self.display == "lines" and (step % self.every == 0 or step == runner.max_iters):
            rate = self.pace.lap(step)[0] if self.pace is not None else 0.0
            write_line(runner.console, report_line(runner, step, scalars, rate))

    @hookimpl
    def before_val_epoch(self, runner: RunnerProtocol) -> None:
        self._start_eval(runner, "val")

    @hookimpl
    def before_test_epoch(self, runner: RunnerProtocol) -> None:
        self._start_eval(runner, "test")

    @hookimpl
    def after_val_iter(self, runner: RunnerProtocol, batch_idx: int) -> None:
        self._eval_iter(runner, batch_idx)

    @hookimpl
    def after_test_iter(self, runner: RunnerProtocol, batch_idx: int) -> None:
        self._eval_iter(runner, batch_idx)

    @hookimpl
    def after_val_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        self._metrics_line(runner, "val", metrics)

    @hookimpl
    def after_test_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        self._metrics_line(runner, "test", metrics)

    @hookimpl(wrapper=True)
    def after_train(self) -> Generator[None, Any, Any]:
        """Stop the bar before every other ``after_train``: the lines printed at the end
        (the timer's totals) come after its last frame, not above it."""
        self._stop_bar()
        return (yield)

    @hookimpl
    def after_run(self) -> None:
        self._stop_bar()

    @hookimpl
    def on_exception(self) -> None:
        self._stop_bar()

    # -- validation and test ------------------------------------------------------------

    def _start_eval(self, runner: RunnerProtocol, mode: str) -> None:
        if self.settings.log_val_iters and self.display != "off":
            loader = runner.val_dataloader if mode == "val" else runner.test_dataloader
            total = len(loader) if isinstance(loader, Sized) else None
            self._eval = [mode, 0, total, time.perf_counter()]

    def _eval_iter(self, runner: RunnerProtocol, batch_idx: int) -> None:
        state = self._eval
        if state is None:
            return
        state[1] = batch_idx + 1
        if self.display == "lines" and state[1] % self.every == 0:
            write_line(runner.console, eval_line(state))

    def _metrics_line(self, runner: RunnerProtocol, mode: str, metrics: dict[str, float]) -> None:
        """One line (``val  epoch 3  iter 24  loss 0.03671 ...``), printed above a bar."""
        self._eval = None
        if runner.is_main and metrics:
            line = metrics_line(runner, mode, metrics)
            if self.live is not None:
                runner.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                write_line(runner.console, line)

    def _stop_bar(self) -> None:
        self._eval = None
        if self.live is not None:
            self.live.stop()
        self.live = None
        self.view = None


class ProgressView:
    """What the progress bar draws. rich's refresh thread renders it on a clock, reading
    host values only, so training never waits for the display."""

    def __init__(self, runner: RunnerProtocol, logger: Logger) -> None:
        self.runner = runner
        self.logger = logger
        self.training = False
        self.values: dict[str, float] = {}
        self.read_at = 0.0
        # (the clock's training time, iteration) at the redraws where the iteration had moved
        # on, about ten seconds of them, for the it/s figure: validation inside training is
        # cut out (``runner.clock.training_time``), as from the report lines' speed (``Pace``)
        self.samples: deque[tuple[float, int]] = deque(
            maxlen=int(10 * logger.settings.refresh_per_second) + 2
        )

    def start_training(self) -> None:
        self.training = True
        self.values = {}
        self.samples.clear()
        self.samples.append((self.runner.clock.training_time(), self.runner.iter))

    def new_values(self, values: dict[str, float], now: float) -> None:
        self.values, self.read_at = values, now

    def __rich__(self) -> RenderableType:
        rows: list[RenderableType] = []
        if self.training:
            rows.append(self._train_row())
        state = self.logger._eval
        if state is not None:
            rows.append(self._eval_row(state))
        return Group(*rows)

    def _train_row(self) -> Table:
        runner, now = self.runner, time.perf_counter()
        done, total = runner.iter, runner.max_iters
        if done != self.samples[-1][1]:  # still during a validation: the speed before it
            self.samples.append((runner.clock.training_time(), done))
        (first_t, first_i), (last_t, last_i) = self.samples[0], self.samples[-1]
        rate = (last_i - first_i) / (last_t - first_t) if last_t > first_t else 0.0
        eta = self.values.get("train/eta")
        if eta is not None:
            eta = max(0.0, eta - (now - self.read_at))
        elif rate > 0 and total is not None:  # a stream's epoch run: known after an epoch
            eta = (total - done) / rate
        loss = self.values.get("train/loss")
        lr = self.values.get("train/lr", self.values.get("train/lr/group0"))
        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            epoch_label(runner),
            ProgressBar(total=None if total is None else max(total, 1), completed=done, width=30),
            f"{done}/{total}" if total is not None else f"{done}",
            "loss " + (format_number(loss) if loss is not None else "-"),
            "lr " + (format_scalar("train/lr", lr) if lr is not None else "-"),
            f"{format_number(rate)} it/s",
            "ETA " + (format_scalar("train/eta", eta) if eta is not None else "-"),
        )
        return grid

    def _eval_row(self, state: list[Any]) -> Table:
        mode, done, total, _ = state
        grid = Table.grid(padding=(0, 1))
        bar = ProgressBar(total=total or 1, completed=done, width=30, pulse=total is None)
        grid.add_row(mode, bar, f"{done}/{total if total is not None else '?'}")
        return grid


def resolve_display(progress: str, console: Console) -> str:
    """``auto`` becomes a bar on an interactive terminal and plain lines anywhere else."""
    if progress != "auto":
        return progress
    return "bar" if console.is_terminal and not console.is_dumb_terminal else "lines"


def eval_line(state: list[Any]) -> str:
    mode, done, total, started = state
    elapsed = time.perf_counter() - started
    rate = done / elapsed if elapsed > 0 else 0.0
    return f"{mode} [{done}/{total if total is not None else '?'}]  {format_number(rate)} it/s"

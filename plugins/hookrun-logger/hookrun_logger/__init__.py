"""hookrun-logger: a progress display, smoothed training scalars for every writer, metric tables.

Training scalars stay on the device between logging intervals; every ``interval`` iterations
they are read to the host in one batched transfer. In between, an iteration costs the logger
one integer check, and the progress bar is redrawn by rich's own thread on a clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from hookrun import Plugin, PluginSettings, Priority, hookimpl

__all__ = ["Logger", "LoggerSettings"]

TIMER_KEYS = ("train/time", "train/data_time", "train/throughput", "train/eta")


class LoggerSettings(PluginSettings):
    """Settings of the ``logger`` plugin."""

    interval: int = Field(
        50,
        ge=1,
        description="Every `interval` training iterations the scalars are read to the host "
        "(one transfer), written to every writer and, in `lines` mode, printed.",
    )
    window: int = Field(
        20,
        ge=1,
        description="Smoothing window: each logged loss is the mean of its last `window` "
        "iterations.",
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


class Logger(Plugin):
    """Console progress, scalars to the writers every ``interval`` iterations, metric tables."""

    name = "logger"
    Settings = LoggerSettings
    priority = Priority.BELOW_NORMAL
    enabled_by_default = True

    def __init__(self, settings: LoggerSettings | None = None) -> None:
        super().__init__(settings)
        self.interval: int = self.settings.interval
        self.display = "off"
        self.view: ProgressView | None = None
        self.live: Live | None = None
        self.values: dict[str, float] = {}  # the last interval's host floats
        self.rate = 0.0  # iterations per second over the last interval
        self._mark = (0.0, 0)  # (clock, iteration) at the last interval
        self._eval: list[Any] | None = None  # [mode, batches done, total, clock] during val/test
        self._lrs: list[Any] = []  # learning rates the interval's last iteration trains with

    @hookimpl
    def before_run(self, runner: Any) -> None:
        runner.scalars.ensure_window(self.settings.window)
        if not runner.is_main:
            self.display = "off"
            return
        config = {**runner.config, "active_plugins": plugin_table(runner)}
        for writer in runner.writers:
            writer.write_config(config)
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
    def before_train(self, runner: Any) -> None:
        self._mark = (time.perf_counter(), runner.iter)
        self.values = {}
        if self.view is not None:
            self.view.start_training()

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if (runner.iter + 1) % self.interval == 0 and runner.optimizer is not None:
            self._lrs = [group["lr"] for group in runner.optimizer.param_groups]

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if (runner.iter + 1) % self.interval:
            return
        if runner.is_main:
            self._log_interval(runner)

    @hookimpl
    def before_val_epoch(self, runner: Any) -> None:
        self._start_eval(runner, "val")

    @hookimpl
    def before_test_epoch(self, runner: Any) -> None:
        self._start_eval(runner, "test")

    @hookimpl
    def after_val_iter(self, runner: Any, batch_idx: int) -> None:
        self._eval_iter(runner, batch_idx)

    @hookimpl
    def after_test_iter(self, runner: Any, batch_idx: int) -> None:
        self._eval_iter(runner, batch_idx)

    @hookimpl
    def after_val_epoch(self, runner: Any, metrics: dict[str, float]) -> None:
        self._metrics_table(runner, "val", metrics)

    @hookimpl
    def after_test_epoch(self, runner: Any, metrics: dict[str, float]) -> None:
        self._metrics_table(runner, "test", metrics)

    @hookimpl
    def after_run(self) -> None:
        self._stop_bar()

    @hookimpl
    def on_exception(self) -> None:
        self._stop_bar()

    # -- the work done once per interval ------------------------------------------------

    def _log_interval(self, runner: Any) -> None:
        step = runner.iter + 1
        values = read_scalars(runner, self.settings.window, self._lrs)
        now = time.perf_counter()
        then, then_iter = self._mark
        self.rate = (step - then_iter) / (now - then) if now > then else 0.0
        self._mark = (now, step)
        self.values = values
        runner.write_scalars(values, step=step)
        if self.view is not None:
            self.view.new_values(values, now)
        elif self.display == "lines":
            eta = values.get("train/eta")
            if eta is None and self.rate > 0:
                eta = (runner.max_iters - step) / self.rate
            write_line(runner.console, train_line(runner, step, values, self.rate, eta))

    # -- validation and test ------------------------------------------------------------

    def _start_eval(self, runner: Any, mode: str) -> None:
        if self.settings.log_val_iters and self.display != "off":
            loader = getattr(runner, f"{mode}_dataloader", None)
            total = len(loader) if hasattr(loader, "__len__") else None
            self._eval = [mode, 0, total, time.perf_counter()]

    def _eval_iter(self, runner: Any, batch_idx: int) -> None:
        state = self._eval
        if state is None:
            return
        state[1] = batch_idx + 1
        if self.display == "lines" and state[1] % self.interval == 0:
            write_line(runner.console, eval_line(state))

    def _metrics_table(self, runner: Any, mode: str, metrics: Mapping[str, float]) -> None:
        self._eval = None
        if runner.is_main and metrics:
            runner.console.print(metrics_table(runner, mode, metrics))

    def _stop_bar(self) -> None:
        self._eval = None
        if self.live is not None:
            self.live.stop()
        self.live = None
        self.view = None


class ProgressView:
    """What the progress bar draws. rich's refresh thread renders it on a clock, reading
    host values only, so training never waits for the display."""

    def __init__(self, runner: Any, logger: Logger) -> None:
        self.runner = runner
        self.logger = logger
        self.training = False
        self.values: dict[str, float] = {}
        self.read_at = 0.0
        self.samples: deque[tuple[float, int]] = deque(
            maxlen=int(10 * logger.settings.refresh_per_second) + 2
        )  # about ten seconds of (clock, iteration) for the it/s figure

    def start_training(self) -> None:
        self.training = True
        self.values = {}
        self.samples.clear()
        self.samples.append((time.perf_counter(), self.runner.iter))

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
        self.samples.append((now, done))
        first_t, first_i = self.samples[0]
        rate = (done - first_i) / (now - first_t) if now > first_t else 0.0
        eta = self.values.get("train/eta")
        if eta is not None:
            eta = max(0.0, eta - (now - self.read_at))
        elif rate > 0:
            eta = (total - done) / rate
        loss = self.values.get("train/loss")
        grid = Table.grid(padding=(0, 1))
        grid.add_row(
            epoch_text(runner),
            ProgressBar(total=max(total, 1), completed=done, width=30),
            f"{done}/{total}",
            "loss " + (fmt(loss) if loss is not None else "-"),
            "lr " + (fmt_lr(self.values) or "-"),
            f"{rate:.1f} it/s",
            "ETA " + (fmt_time(eta) if eta is not None else "-"),
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


def read_scalars(runner: Any, window: int, lrs: list[Any]) -> dict[str, float]:
    """Smoothed ``train/*`` scalars, the learning rates ``lrs``, timer values and peak memory,
    read to the host in one batched transfer (window means are taken on the device first)."""
    # Imported here, as in window_mean: reading the settings (`hookrun plugins show`, config
    # validation) then never imports torch.
    import torch

    from hookrun.scalars import to_floats

    store = runner.scalars
    names = store.names()
    smoothed = [n for n in names if n.startswith("train/") and n not in TIMER_KEYS]
    timer = [n for n in TIMER_KEYS if n in names]
    pending = [window_mean(store.history(name)[-window:]) for name in smoothed]
    pending += [store.history(name)[-1] for name in timer]
    floats = to_floats(pending + lrs)
    out = dict(zip(smoothed, floats, strict=False))
    lr_values = floats[len(pending) :]
    if lr_values and all(lr == lr_values[0] for lr in lr_values):
        out["train/lr"] = lr_values[0]
    else:
        out.update({f"train/lr/group{i}": lr for i, lr in enumerate(lr_values)})
    out.update(zip(timer, floats[len(smoothed) : len(pending)], strict=True))
    if runner.device.type == "cuda":
        out["train/memory"] = torch.cuda.max_memory_allocated(runner.device) / 2**20
        torch.cuda.reset_peak_memory_stats(runner.device)
    return out


def window_mean(values: list[Any]) -> Any:
    """Mean of numbers and/or tensors, in float64, left on the device: nothing is read here."""
    import torch

    try:  # the usual case, same-shaped tensors on one device: two small ops
        return torch.stack(values).mean(dtype=torch.float64)
    except (TypeError, RuntimeError):  # numbers (or objects with __float__), mixed tensors
        total: Any = 0.0
        for value in values:
            if isinstance(value, torch.Tensor):
                total = total + value.detach().to(torch.float64).mean()
            else:
                total = total + float(value)
        return total / len(values)


def plugin_table(runner: Any) -> list[dict[str, Any]]:
    """Active plugins and ad-hoc hooks in call order, with priority and settings."""
    rows = []
    for name, obj in runner.manager.ordered:
        row: dict[str, Any] = {"name": name, "priority": int(getattr(obj, "priority", 50))}
        settings = getattr(obj, "settings", None)
        if isinstance(obj, Plugin) and hasattr(settings, "model_dump"):
            row["settings"] = settings.model_dump(mode="json")
        rows.append(row)
    return rows


def write_line(console: Console, line: str) -> None:
    """A plain line straight to the console's file: ``lines`` mode has no live display to
    keep intact, and this costs a microsecond where ``Console.print`` costs ~100."""
    if not console.quiet:
        console.file.write(line + "\n")
        console.file.flush()


def train_line(
    runner: Any, step: int, values: Mapping[str, float], rate: float, eta: float | None
) -> str:
    """One plain console line for an interval (``lines`` mode)."""
    parts = [epoch_text(runner), f"iter {step}/{runner.max_iters}"]
    for name, value in values.items():
        key = name.removeprefix("train/")
        if name in TIMER_KEYS or key == "lr" or key.startswith("lr/") or key == "memory":
            continue
        parts.append(f"{key} {fmt(value)}")
    lr = fmt_lr(values)
    if lr:
        parts.append(f"lr {lr}")
    parts.append(f"{rate:.1f} it/s")
    if eta is not None:
        parts.append(f"eta {fmt_time(eta)}")
    if "train/time" in values:
        parts.append(f"time {values['train/time']:.4f}s")
    if "train/data_time" in values:
        parts.append(f"data_time {values['train/data_time']:.4f}s")
    if "train/memory" in values:
        parts.append(f"memory {values['train/memory']:.0f}MiB")
    return "  ".join(parts)


def eval_line(state: list[Any]) -> str:
    mode, done, total, started = state
    elapsed = time.perf_counter() - started
    rate = done / elapsed if elapsed > 0 else 0.0
    return f"{mode} [{done}/{total if total is not None else '?'}]  {rate:.1f} it/s"


def metrics_table(runner: Any, mode: str, metrics: Mapping[str, float]) -> Table:
    where = f"epoch {runner.epoch}, iter {runner.iter}" if mode == "val" else f"iter {runner.iter}"
    title = f"{mode} ({where})"
    table = Table(title=title, title_justify="left", min_width=len(title))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.items():
        table.add_row(name, fmt(value))
    return table


def epoch_text(runner: Any) -> str:
    epoch = runner.epoch + 1
    if runner.by_epoch and runner.max_epochs:
        return f"epoch {min(epoch, runner.max_epochs)}/{runner.max_epochs}"
    return f"epoch {epoch}"


def fmt(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.3e}"


def fmt_lr(values: Mapping[str, float]) -> str:
    lr = values.get("train/lr", values.get("train/lr/group0"))
    return "" if lr is None else f"{lr:.3e}"


def fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"

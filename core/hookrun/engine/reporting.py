"""Training reports, owned by the core: every ``log_interval`` iterations, at each epoch's
end and after the last iteration (the loop decides, inline), the scalar store is read once
(one host transfer from a GPU) and ``train/*`` goes to every writer, then ``after_report``
lets plugins render it. When no plugin renders the console (``Plugin.renders_console``), the
core prints :func:`report_line` itself at every report, and :func:`metrics_line` after each
validation and test.

Between reports an iteration costs one integer check: tensors stay on the device. Under
torch.distributed a report point is also where the ranks meet, in one small all-reduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hookrun.cli.numbers import format_number, format_scalar
from hookrun.engine.position import ValidationSchedule

if TYPE_CHECKING:  # torch is imported on use: the logger imports the line functions
    from rich.console import Console

    from hookrun.engine.clock import IterationClock

#: Shown in their own places on a report line, not as ``name value`` pairs.
OWN_PLACE = ("train/eta", "train/lr")


class Pace:
    """Iterations per second from one lap to the next, the training loop's validation passes
    cut out: the core's report lines and the logger's lines measure their speed with it."""

    def __init__(self, clock: IterationClock) -> None:
        self.clock = clock
        # (the clock's training time, completed iterations) at the last lap
        self._mark = (clock.training_time(), 0)

    def start(self, done: int) -> None:
        """Begin timing at ``done`` completed iterations (when training starts)."""
        self._mark = (self.clock.training_time(), done)

    def lap(self, done: int) -> tuple[float, int, float]:
        """``(iterations per second, iterations, seconds trained)`` since the previous lap,
        at ``done`` completed iterations; the next lap starts here."""
        now = self.clock.training_time()
        then, then_done = self._mark
        self._mark = (now, done)
        seconds = max(now - then, 0.0)
        iterations = done - then_done
        return (iterations / seconds if seconds > 0 else 0.0), iterations, seconds


class Reporter:
    """Reads, writes and announces training reports; measures the ETA on the way."""

    def __init__(self, runner: Any, interval: int) -> None:
        self.runner = runner
        self.interval = interval
        self.lrs: dict[str, list[float]] = {}  # the rates the reported iteration trained with
        self.laps = Pace(runner.clock)  # the speed between reports
        # the run's last iteration, fixed when training starts (None in an epoch run over a
        # stream until its first epoch ended: no ETA until then)
        self.last: int | None = 0
        self.group: Any = None  # a gloo group for the report points' all-reduce (CPU tensors)
        # the core prints the console lines itself when no plugin renders the console
        self.prints = not any(
            getattr(plugin, "renders_console", False) for plugin in runner.plugins.values()
        )

    def start(self, done: int) -> None:
        runner = self.runner
        self.laps.start(done)
        self.last = runner.max_iters
        if runner.world_size > 1 and self.group is None:
            import torch.distributed as dist

            timeout = timedelta(seconds=runner.dist_timeout)
            self.group = dist.new_group(backend="gloo", timeout=timeout)

    def agree_ranks(self) -> None:
        """Under torch.distributed, every rank at every report point: one all-reduce (max) of
        two numbers, on the CPU (no device sync), tells every rank the stop signal any rank
        caught and the slowest rank's mean data time over the interval
        (``clock.slowest_data_time``, which the timer publishes)."""
        import torch
        import torch.distributed as dist

        runner = self.runner
        stop, clock = runner.stop_signals, runner.clock
        numbers = [float(stop.caught or 0), clock.take_data_time()]
        values = torch.tensor(numbers, dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        signum, clock.slowest_data_time = values.tolist()
        stop.settle(int(signum))

    def keep_lrs(self) -> None:
        """Called before a reported iteration's step: its learning rates are the ones logged."""
        self.lrs = {
            name: [float(group["lr"]) for group in optimizer.param_groups if "lr" in group]
            for name, optimizer in self.runner.optimizers.items()
        }

    def report(self, done: int) -> None:
        """Read, write and announce the report of ``done`` completed iterations (rank 0).
        ``train/eta`` goes to ``after_report`` (and the console) but to no writer: it is a
        moment's estimate, not a series."""
        runner = self.runner
        runner.clock.fold()
        if not runner.is_main:
            return
        scalars = runner.scalars.report("train/")
        scalars.update(lr_scalars(self.lrs))
        rate, eta = self.pace(done)
        if runner.device.type == "cuda":
            import torch

            scalars["train/memory"] = torch.cuda.max_memory_allocated(runner.device) / 2**20
            torch.cuda.reset_peak_memory_stats(runner.device)
        runner.write_scalars(scalars, step=done)
        if eta is not None:
            scalars = {**scalars, "train/eta": eta}
        runner.hooks.after_report(runner=runner, scalars=scalars, step=done)
        if self.prints:
            write_line(runner.console, report_line(runner, done, scalars, rate))

    def pace(self, done: int) -> tuple[float, float | None]:
        """Iterations per second since the previous report, validation cut out, and the
        seconds left: the remaining iterations at that pace plus the remaining validations
        at their measured mean (None while the run's length is unknown)."""
        clock = self.runner.clock
        rate, iterations, seconds = self.laps.lap(done)
        if iterations <= 0 or self.last is None:
            return rate, None
        eta = (self.last - done) * seconds / iterations
        if clock.val_passes:
            mean = clock.val_seconds / clock.val_passes
            eta += remaining_validations(self.runner, done) * mean
        return rate, eta


def report_line(runner: Any, step: int, scalars: Mapping[str, float], rate: float) -> str:
    """One plain console line for a report: the epoch, the iteration, every ``train/*``
    scalar with its unit, the learning rate, the speed (``rate`` iterations per second)
    and the ETA. The logger's ``lines`` mode and the core's own console print it."""
    total = runner.max_iters  # None: a stream whose first epoch has not ended
    parts = [epoch_label(runner), f"iter {step}" + (f"/{total}" if total is not None else "")]
    for name, value in scalars.items():
        if name not in OWN_PLACE and not name.startswith("train/lr/"):
            parts.append(f"{name.removeprefix('train/')} {format_scalar(name, value)}")
    lr = scalars.get("train/lr", scalars.get("train/lr/group0"))
    if lr is not None:
        parts.append(f"lr {format_scalar('train/lr', lr)}")
    parts.append(f"{format_number(rate)} it/s")
    if "train/eta" in scalars:
        parts.append(f"eta {format_scalar('train/eta', scalars['train/eta'])}")
    return "  ".join(parts)


def epoch_label(runner: Any) -> str:
    """The running epoch as the console counts it, from 1: ``epoch 2/15`` when the run is
    a number of epochs, else ``epoch 2``."""
    epoch = runner.epoch + 1
    if runner.by_epoch and runner.max_epochs:
        return f"epoch {min(epoch, runner.max_epochs)}/{runner.max_epochs}"
    return f"epoch {epoch}"


def metrics_line(runner: Any, mode: str, metrics: Mapping[str, float]) -> str:
    """One console line for a validation or test:
    ``val  epoch 3  iter 24  loss 0.03671  accuracy 0.9889`` (a test has no epoch). During
    ``after_val_epoch`` ``runner.epoch`` counts the epochs done: the epoch validated."""
    where = f"epoch {runner.epoch}  iter {runner.iter}" if mode == "val" else f"iter {runner.iter}"
    values = [f"{name} {format_number(value)}" for name, value in metrics.items()]
    return "  ".join([mode, where, *values])


def write_line(console: Console, line: str) -> None:
    """A plain line straight to the console's file, unless the console is quiet: there is
    no live display to keep intact, and this costs a microsecond where ``Console.print``
    costs ~100."""
    if not console.quiet:
        console.file.write(line + "\n")
        console.file.flush()


def remaining_validations(runner: Any, done: int) -> int:
    """Validations still to run after ``done`` completed iterations. Reports happen inside an
    epoch, so in an epoch-based run ``position.epoch`` epochs are complete."""
    schedule: ValidationSchedule = runner.validation_schedule
    return schedule.remaining(runner.position.epoch if schedule.by_epoch else done)


def lr_scalars(lrs: Mapping[str, list[float]]) -> dict[str, float]:
    """``train/lr``, or ``train/lr/group<i>`` when parameter groups differ; with several
    optimizers each under its name: ``train/lr/<name>`` (``train/lr/<name>/group<i>``)."""
    scalars = {}
    for name, rates in lrs.items():
        prefix = "train/lr" if len(lrs) == 1 else f"train/lr/{name}"
        if rates and all(lr == rates[0] for lr in rates):
            scalars[prefix] = rates[0]
        else:
            scalars.update({f"{prefix}/group{i}": lr for i, lr in enumerate(rates)})
    return scalars

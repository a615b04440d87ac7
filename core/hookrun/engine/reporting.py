"""Training reports, owned by the core: every ``log_interval`` iterations, at each epoch's
end and after the last iteration (the loop decides, inline), the scalar store is read once
(one host transfer from a GPU) and ``train/*`` goes to every writer, then ``after_report``
lets plugins render it.

Between reports an iteration costs one integer check: tensors stay on the device. Under
torch.distributed a report point is also where the ranks meet, in one small all-reduce.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch

from hookrun.engine.position import ValidationSchedule


class Reporter:
    """Reads, writes and announces training reports; measures the ETA on the way."""

    def __init__(self, runner: Any, interval: int) -> None:
        self.runner = runner
        self.interval = interval
        self.lrs: dict[str, list[float]] = {}  # the rates the reported iteration trained with
        # (clock, completed iterations, the clock's validation seconds) at the previous report
        self.mark = (0.0, 0, 0.0)
        # the run's last iteration, fixed when training starts (None in an epoch run over a
        # stream until its first epoch ended: no ETA until then)
        self.last: int | None = 0
        self.group: Any = None  # a gloo group for the report points' all-reduce (CPU tensors)

    def start(self, done: int) -> None:
        runner = self.runner
        self.mark = (time.perf_counter(), done, runner.clock.val_seconds)
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
        """Read, write and announce the report of ``done`` completed iterations (rank 0)."""
        runner = self.runner
        runner.clock.fold()
        if not runner.is_main:
            return
        scalars = runner.scalars.report("train/")
        scalars.update(lr_scalars(self.lrs))
        eta = self.eta(done)
        if eta is not None:
            scalars["train/eta"] = eta
        if runner.device.type == "cuda":
            scalars["train/memory"] = torch.cuda.max_memory_allocated(runner.device) / 2**20
            torch.cuda.reset_peak_memory_stats(runner.device)
        runner.write_scalars(scalars, step=done)
        runner.hooks.after_report(runner=runner, scalars=scalars, step=done)

    def eta(self, done: int) -> float | None:
        """Seconds left: the remaining iterations at the last interval's pace (validation cut
        out), plus the remaining validations at their measured mean."""
        clock = self.runner.clock
        now, validating = time.perf_counter(), clock.val_seconds
        then, then_done, then_validating = self.mark
        self.mark = (now, done, validating)
        if done <= then_done or self.last is None:
            return None
        seconds = now - then - (validating - then_validating)
        eta = (self.last - done) * max(seconds, 0.0) / (done - then_done)
        if clock.val_passes:
            mean = validating / clock.val_passes
            eta += remaining_validations(self.runner, done) * mean
        return eta


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

"""The training loop: which hook fires when, over a saved position.

The loop is one state machine over :class:`~hookrun.engine.position.LoopPosition`, which is
what makes mid-epoch resume exact. One iteration's work is
:class:`~hookrun.engine.train_step.TrainStep`'s; validation is
:mod:`hookrun.engine.evaluation`'s.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

import torch

from hookrun.data.batches import batch_size, to_device
from hookrun.data.sharding import last_batch
from hookrun.distributed import process_group
from hookrun.engine.evaluation import evaluate_or_stop
from hookrun.engine.position import (
    LoopPosition,
    Phase,
    ValidationSchedule,
    group_done,
    group_ends,
)
from hookrun.engine.train_step import TrainStep
from hookrun.errors import ConfigError


class TrainLoop:
    """Epochs of training iterations with validation as scheduled, from ``runner.position``."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.hooks = runner.hooks
        self.loader = runner._loaders["train"]
        self.stop = runner.stop_signals
        self.stop_saved = False

    def run(self) -> None:
        runner, loader = self.runner, self.loader
        per_epoch = None if loader.stream else loader.length  # a stream's epoch ends with it
        if per_epoch == 0:
            raise ConfigError("train_dataloader: yields no batches")
        if per_epoch is None and runner.grad_accum > 1 and runner.strategy == "fsdp":
            raise ConfigError(  # FSDP's reduction of the group's last batch was skipped
                "runner.grad_accum: under FSDP a stream's epoch cannot end inside an "
                "accumulation group; use grad_accum 1, strategy ddp, or a loader with a length"
            )
        pos: LoopPosition = runner.position
        by_epoch = runner.validation_schedule.by_epoch  # validates at epoch ends
        # a save at a group's end, taken before the validation due there (a stop signal's)
        pending_val = self.validation_waiting() and pos.closes_group
        runner.stop_training = False
        runner.reporter.start(pos.iter)
        while not self.finished():
            if pos.phase is Phase.TRAIN or (not by_epoch and pos.phase is Phase.VALIDATED):
                if pending_val:
                    self.validate()
                    pending_val = False
                ended = False  # a stream's iterator ended: its epoch is complete
                more = per_epoch is None or pos.batch < per_epoch
                if more and not runner.stop_training and not self.iters_done():
                    runner.unwrapped_model.train()
                    self.hooks.before_train_epoch(runner=runner)
                    ended = self.train_epoch(pos.batch, per_epoch)
                self.end_epoch(per_epoch, ended)
            if self.stop.agreed is None and self.epoch_validation_due():
                self.validate()
            if runner.stop_training or self.iters_done() or self.stopping():
                break
            pos.next_epoch()

    def finished(self) -> bool:
        """Whether the position restored (or reached) leaves nothing to do."""
        runner, pos = self.runner, self.runner.position
        if runner.by_epoch:
            last = runner.max_epochs
            # validated by iterations, the last validation precedes the epoch's end
            closed = Phase.VALIDATED if runner.validation_schedule.by_epoch else Phase.TRAINED
            return pos.epoch >= last or (pos.epoch + 1 == last and pos.phase is closed)
        return pos.iter >= runner.max_iters and pos.phase is not Phase.TRAIN

    def validation_waiting(self) -> bool:
        """Whether a validation of an iteration-based run fell due in the current accumulation
        group, up to the position, and has not run: validation waits for the group's end,
        so the checkpoints taken with it (a best file) hold no partial gradients."""
        runner, pos = self.runner, self.runner.position
        if runner.validation_schedule.by_epoch or pos.phase is not Phase.TRAIN or pos.batch == 0:
            return False
        in_group = group_done(pos.batch, runner.grad_accum)
        return any(runner.validation_schedule.due(pos.iter - k) for k in range(in_group))

    def iters_done(self) -> bool:
        runner = self.runner
        return not runner.by_epoch and runner.position.iter >= runner.max_iters

    def next_report(self, done: int, per_epoch: int | None) -> int:
        """The iteration after ``done`` whose end reports: a multiple of the log interval,
        the epoch's last or the run's last, whichever comes first."""
        runner = self.runner
        interval, last = runner.reporter.interval, runner.reporter.last
        due = (done // interval + 1) * interval
        epoch_end = None if per_epoch is None else done - runner.position.batch + per_epoch
        for end in (epoch_end, last):
            if end is not None and end > done:
                due = min(due, end)
        return due

    def next_check(self, done: int, schedule: ValidationSchedule) -> int:
        """The iteration after ``done`` whose end may validate or end the run (an
        iteration-based one); 0 when none does (a stop is checked for on its own)."""
        runner = self.runner
        if schedule.by_epoch:
            return 0
        due = schedule.next_due(done)
        if not runner.by_epoch and runner.max_iters is not None and runner.max_iters > done:
            due = runner.max_iters if due is None else min(due, runner.max_iters)
        return 0 if due is None else due

    def epoch_validation_due(self) -> bool:
        """After a whole epoch of an epoch-based run; also when a hook stopped training at
        the epoch's end (docs/hooks.md), not when it stopped mid-epoch."""
        runner, pos = self.runner, self.runner.position
        schedule = runner.validation_schedule
        if not schedule.by_epoch or pos.phase is not Phase.TRAINED:
            return False
        return schedule.due(pos.epoch + 1)

    def train_epoch(self, skip: int, per_epoch: int | None) -> bool:
        """Train the epoch's batches after the first ``skip``; True when the iterator ended
        (not a stop, nor the run's last iteration)."""
        runner, hooks, pos = self.runner, self.hooks, self.runner.position
        device = runner.device
        move = device.type != "cpu"  # loaders yield CPU tensors; moving them to CPU is a no-op
        reporter, schedule = runner.reporter, runner.validation_schedule
        # iteration-based runs and val_every_n_iters validate mid-epoch; only the former end there
        by_iters = not schedule.by_epoch
        step = TrainStep(runner, per_epoch)
        take = step.take
        stop = self.stop
        agree = reporter.agree_ranks if runner.world_size > 1 else None
        accum = runner.grad_accum
        group_end = accum == 1  # then every batch closes its group
        if group_end:
            pos.closes_group = True
        val_due = self.validation_waiting()  # resumed inside a group
        # the next iterations (done) that report, and that validate or end the run
        report_at = self.next_report(pos.iter, per_epoch)
        check_at = self.next_check(pos.iter, schedule)
        transform = hooks.transform_batch if hooks.transform_batch.used else None
        before_iter = hooks.before_train_iter if hooks.before_train_iter.used else None
        after_iter = hooks.after_train_iter if hooks.after_train_iter.used else None
        clock = runner.clock  # read inline: a method call per iteration costs a microsecond
        record, now, world = clock.pending.append, time.perf_counter, runner.world_size
        timed = clock.recording  # else nobody reads the iterations' timings
        mark = since = now()  # the previous iteration's end; the end of its hooks
        batches: Iterable[Any] = self.loader.epoch_iter(pos.epoch, skip)
        step.uneven, short = last_batch(self.loader, pos.epoch)
        report = True  # nothing of this epoch to report when its iterator is already over
        if short:  # this rank's share ends a batch early: it joins the last iteration
            batches = itertools.chain(batches, [None])  # without a batch
        for batch_idx, batch in enumerate(batches, start=skip):
            if timed:
                arrived = now()
                first = batch[0] if type(batch) in (tuple, list) and batch else batch
                if type(first) is torch.Tensor and first.ndim:  # the usual batch, read inline
                    count = first.shape[0]
                else:
                    count = batch_size(batch) if batch is not None else 0
            if move:
                batch = to_device(batch, device)
            if transform is not None and batch is not None:
                batch = transform(runner=runner, batch=batch, mode="train")
            if accum != 1:
                pos.closes_group = group_end = group_ends(batch_idx + 1, per_epoch, accum)
            if before_iter is not None:
                before_iter(runner=runner, batch_idx=batch_idx, batch=batch)
            done = pos.iter + 1
            report = done == report_at
            if report:
                reporter.keep_lrs()
            outputs = take(batch, batch_idx)
            if timed:
                ended = now()
                record((ended - mark, arrived - since, count * world))
                mark = since = ended
            if after_iter is not None:
                after_iter(runner=runner, batch_idx=batch_idx, batch=batch, outputs=outputs)
                since = now()
            pos.iter_ending = False
            if report:
                paused = now()
                if agree is not None:
                    agree()
                reporter.report(done)
                report_at = self.next_report(done, per_epoch)
                paused = now() - paused  # reports are cut out of the next period
                mark, since = mark + paused, since + paused
            if not (val_due or done == check_at or runner.stop_training or stop.agreed):
                continue  # nothing to validate, no stop: the usual iteration ends here
            if done == check_at:
                check_at = self.next_check(done, schedule)
            # a stop and a validation wait for the accumulation group's end: partial gradients
            # are not saved, so the checkpoints taken then would not resume exactly
            halt = stop.agreed is not None and group_end
            ending = runner.stop_training or halt or (by_iters and self.iters_done())
            val_due = val_due or (by_iters and schedule.due(done))
            if val_due and not halt and (group_end or ending):
                val_due = False
                paused = now()
                self.validate()
                paused = now() - paused
                mark, since = mark + paused, since + paused
            if ending or runner.stop_training:
                break
        else:
            if per_epoch is None:  # a stream: its epoch's end is known only now
                halt = stop.agreed is not None
                self.end_stream_epoch(step, report, val_due and not halt)
            self.stopping()
            return True
        self.stopping()
        return False

    def end_stream_epoch(self, step: TrainStep, reported: bool, val_due: bool) -> None:
        """A stream's iterator ended: its last, short accumulation group steps now (after
        its last ``after_train_iter``, before ``after_train_epoch``), the epoch's last
        iteration is reported if it was not, and a validation that waited for the group's
        end runs."""
        runner, pos = self.runner, self.runner.position
        if pos.batch == 0:
            return
        if not reported:  # the rates the last iteration's group steps with
            runner.reporter.keep_lrs()
        if not pos.closes_group:
            step.close_group()
        if not reported:
            if runner.world_size > 1:
                runner.reporter.agree_ranks()
            runner.reporter.report(pos.iter)
        if val_due:
            self.validate()

    def end_epoch(self, per_epoch: int | None, ended: bool) -> None:
        """Close an epoch; one cut short by ``stop_training`` stays resumable mid-epoch. A
        stream's first complete epoch gives its length (for the ETA and totals)."""
        runner, pos = self.runner, self.runner.position
        complete = ended if per_epoch is None else pos.batch >= per_epoch
        if complete and per_epoch is None and self.loader.length is None:
            self.loader.length = pos.batch
            runner.reporter.last = runner.max_iters
        if complete and runner.scheduler_interval == "epoch":
            for scheduler in runner.schedulers.values():
                scheduler.step()
        if complete or self.iters_done():
            pos.phase = Phase.TRAINED
        process_group.broadcast_buffers(runner.unwrapped_model)
        pos.epoch_ending = True
        self.hooks.after_train_epoch(runner=runner)
        pos.epoch_ending = False

    def validate(self) -> None:
        """Validate; the position says so before ``after_val_epoch``, so a checkpoint saved
        from there on (a best one) resumes after this validation, with the random state it
        left. A stop signal inside validation cuts it short: the random state goes back to
        where validation began, and the stop's save resumes by validating again."""
        runner, pos = self.runner, self.runner.position
        start = time.perf_counter()
        rng = runner.rng_state() if self.stop.numbers else None

        def validated() -> None:
            pos.phase = Phase.VALIDATED

        metrics = evaluate_or_stop(
            runner, runner._loaders["val"], "val", True, done=validated, stoppable=True
        )
        runner.clock.validated(time.perf_counter() - start)
        if metrics is None and rng is not None:
            runner.set_rng_state(rng)
            self.stopping()

    def stopping(self) -> bool:
        """Whether a stop signal ends training here; the first time, save the state for it:
        the checkpoint plugin's ``save_on_stop``, else the core's ``stop_iter_<N>.pt``."""
        signum = self.stop.agreed
        if signum is None:
            return False
        self.stop.acting()  # a save may take long: no longer a stop that cannot be honoured
        runner = self.runner
        runner.stop_training = True
        if not self.stop_saved:
            self.stop_saved = True
            path = runner.hooks.save_on_stop(runner=runner, signum=signum)
            if path is None:
                path = runner.save_checkpoint(
                    runner.checkpoint_dir / f"stop_iter_{runner.position.iter}.pt"
                )
            self.stop.saved(signum, path, runner.is_main)
        return True

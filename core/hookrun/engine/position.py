"""Where a run stands, and when it validates: the one source of truth for both.

The position is what a checkpoint stores under ``"loop"``; resuming from it continues
exactly, mid-epoch too. The validation schedule is asked by the training loop, the ETA and
any plugin that needs to know what is still to come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

DEFAULT_MAX_EPOCHS = 10
"""Epochs of a run given neither ``max_epochs`` nor ``max_iters``: one value, so a
:class:`~hookrun.Runner` and ``hookrun schedule`` of the same config agree on the length."""


def group_ends(batches: int, per_epoch: int | None, grad_accum: int) -> bool:
    """Whether ``batches`` done in an epoch end an accumulation group: every
    ``grad_accum``-th batch, and the epoch's last (a short group when it does not divide).
    A stream's epoch (``per_epoch`` None) has no known last batch: the training loop steps
    its short last group once its iterator has ended."""
    return batches % grad_accum == 0 or batches == per_epoch


def groups_closed(epochs: int, batches: int, per_epoch: int, grad_accum: int) -> int:
    """Accumulation groups (so optimizer steps) closed after ``epochs`` whole epochs and
    ``batches`` (at most ``per_epoch``) batches of the next, by :func:`group_ends`."""
    per_group = -(-per_epoch // grad_accum)
    return epochs * per_group + (per_group if batches >= per_epoch else batches // grad_accum)


def group_done(batches: int, grad_accum: int) -> int:
    """Batches of the group in progress after ``batches`` (at least 1) of an epoch: groups
    start at every ``grad_accum``-th batch."""
    return (batches - 1) % grad_accum + 1


class Phase(str, Enum):
    """What is done in the current epoch: training (``TRAIN``), its last batch
    (``TRAINED``), or its validation (``VALIDATED``; mid-epoch in iteration-based runs)."""

    TRAIN = "train"
    """Training the epoch's batches."""
    TRAINED = "trained"
    """The epoch's batches are done, its validation is not."""
    VALIDATED = "validated"
    """Validation is done (mid-epoch in iteration-based runs)."""


@dataclass
class LoopPosition:
    """The saved position: ``epoch`` (0-based), ``batch`` (batches done in it), ``iter``
    (iterations done in the run), ``phase``.

    ``iter_ending`` is true from the end of an optimizer step through its
    ``after_train_iter`` hooks, ``epoch_ending`` through ``after_train_epoch``: the runner's
    counters advance after the ``after_*`` hooks (docs/hooks.md). ``stepping`` is true from the
    optimizer step until the position counts it: the weights and the position disagree then,
    so no checkpoint may be taken. None of the three is saved.

    ``closes_group`` and ``optimizer_steps`` are the loop's accumulation facts, the one
    place the core and plugins read them from. In automatic optimization both follow from
    the position (:meth:`recount`); manual optimization's steps do not, so the steps are
    saved too."""

    epoch: int = 0
    """The epoch (0-based)."""
    batch: int = 0
    """Batches done in it."""
    iter: int = 0
    """Iterations done in the run."""
    phase: Phase = Phase.TRAIN
    """What is done of the epoch."""
    iter_ending: bool = False
    """True from an optimizer step's end through its ``after_train_iter`` hooks."""
    epoch_ending: bool = False
    """True through ``after_train_epoch``."""
    stepping: bool = False
    """True from the optimizer step until the position counts it: no checkpoint then."""
    closes_group: bool = False
    """Whether the running iteration ends an accumulation group, so its optimizer step
    follows its backward (every ``grad_accum``-th batch of an epoch, and the epoch's last):
    set before ``before_train_iter``, kept through ``after_train_iter``; between iterations,
    whether the last one done closed a group."""
    optimizer_steps: dict[str, int] = field(default_factory=dict)
    """Each optimizer's steps taken in the run, by name (``"main"`` when there is one),
    counted as each is taken: in automatic optimization one per accumulation group, inside
    ``after_optimizer_step`` already counting the step just taken. A step AMP's GradScaler
    skips for inf/NaN gradients counts, as Lightning's progress counts every optimizer step
    call (knowing the skip would cost a device sync per step), and so does one a
    ``before_optimizer_step`` hook vetoes; the per-iteration schedule steps at each of them
    too. So each count is its schedule's step count."""

    def state_dict(self) -> dict[str, Any]:
        """Plain types only (``weights_only`` loading), the ``hookrun/1`` layout."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "phase": self.phase.value,
            "iter": self.iter,
            "optimizer_steps": dict(self.optimizer_steps),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LoopPosition:
        """The position a checkpoint's ``"loop"`` entry (:meth:`state_dict`) describes."""
        return cls(
            epoch=int(state["epoch"]),
            batch=int(state["batch"]),
            iter=int(state["iter"]),
            phase=Phase(state["phase"]),
            optimizer_steps={str(k): int(v) for k, v in state.get("optimizer_steps", {}).items()},
        )

    def recount(
        self, per_epoch: int | None, grad_accum: int, names: list[str], manual: bool
    ) -> None:
        """Set the accumulation facts a restored position implies, with this run's epoch
        length (as the schedule continues); manual optimization keeps the saved steps, and
        so does a stream (``per_epoch`` None), whose epochs' lengths are not known."""
        if per_epoch is None:  # a stream's epoch over: its last group has stepped
            self.closes_group = self.batch % grad_accum == 0 or self.phase is not Phase.TRAIN
            return
        batches = min(self.batch, per_epoch)
        self.closes_group = group_ends(batches, per_epoch, grad_accum)
        if not manual:
            steps = groups_closed(self.epoch, batches, per_epoch, grad_accum)
            self.optimizer_steps = dict.fromkeys(names, steps)

    def iteration_done(self, batches: int) -> None:
        """A training iteration's step is over: ``batches`` done in the epoch, one more in
        the run; ``iter_ending`` through its ``after_train_iter`` hooks, and the weights and
        the position agree again."""
        self.batch = batches
        self.iter += 1
        self.phase = Phase.TRAIN
        self.iter_ending = True
        self.stepping = False

    def epoch_closed(self, by_epoch: bool) -> bool:
        """Whether the current epoch's training is over (its last batch done)."""
        return self.phase is Phase.TRAINED or (by_epoch and self.phase is Phase.VALIDATED)

    def next_epoch(self) -> None:
        """Move to the next epoch's first batch."""
        self.epoch += 1
        self.batch = 0
        self.phase = Phase.TRAIN


@dataclass(frozen=True)
class ValidationSchedule:
    """When validation runs: after every ``interval``-th epoch (iteration, in iteration-based
    runs) and always at the end; never without a validation loader."""

    by_epoch: bool
    interval: int
    last: int  # max_epochs or max_iters
    has_val: bool

    def due(self, done: int) -> bool:
        """Whether validation follows ``done`` completed epochs (iterations)."""
        if not self.has_val or done <= 0:
            return False
        return done % self.interval == 0 or done == self.last

    def next_due(self, done: int) -> int | None:
        """The first count after ``done`` completed epochs (iterations) that validation
        follows (:meth:`due`); None without a validation loader."""
        if not self.has_val:
            return None
        due = (done // self.interval + 1) * self.interval
        return min(due, self.last) if self.last > done else due

    def remaining(self, done: int) -> int:
        """Validations still to run after ``done`` completed epochs (iterations)."""
        if not self.has_val or done >= self.last:
            return 0
        count = self.last // self.interval - done // self.interval
        return count + (1 if self.last % self.interval else 0)

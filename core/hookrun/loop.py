"""Where a run stands, and when it validates: the one source of truth for both.

The position is what a checkpoint stores under ``"loop"``; resuming from it continues
exactly, mid-epoch too. The validation schedule is asked by the training loop, the ETA and
any plugin that needs to know what is still to come.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


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
    so no checkpoint may be taken. None of the three is saved."""

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

    def state_dict(self) -> dict[str, Any]:
        """Plain types only (``weights_only`` loading), the ``hookrun/1`` layout."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "phase": self.phase.value,
            "iter": self.iter,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LoopPosition:
        """The position a checkpoint's ``"loop"`` entry (:meth:`state_dict`) describes."""
        return cls(
            epoch=int(state["epoch"]),
            batch=int(state["batch"]),
            iter=int(state["iter"]),
            phase=Phase(state["phase"]),
        )

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

    def remaining(self, done: int) -> int:
        """Validations still to run after ``done`` completed epochs (iterations)."""
        if not self.has_val or done >= self.last:
            return 0
        count = self.last // self.interval - done // self.interval
        return count + (1 if self.last % self.interval else 0)

"""What the checkpoint code needs of a run, and nothing more.

:mod:`hookrun.checkpoint.state`, :mod:`hookrun.checkpoint.resume`,
:mod:`hookrun.checkpoint.fit` and :mod:`hookrun.checkpoint.sharded` collect, check and
restore through this Protocol instead of the Runner, so the checkpoint side never imports
the engine that uses it; the Runner is one (checked in :mod:`hookrun.engine.runner`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from hookrun.checkpoint.storage import URL
    from hookrun.engine.position import LoopPosition, ValidationSchedule


class Checkpointable(Protocol):
    """A run as its checkpoints see it: the objects whose states a checkpoint holds, its
    position, its processes and its folders."""

    position: LoopPosition
    """Where the run is; a resume sets it."""
    resumed_from: Path | URL | None
    """The checkpoint the run continued from; a resume sets it."""
    checkpoint_dir: Path | URL
    """The run's checkpoint folder: where ``resume="auto"`` looks."""
    optimizers: dict[str, Any]
    """The optimizers by name (``"main"`` when there is one)."""
    schedulers: dict[str, Any]
    """The schedulers by their optimizer's name."""
    scaler: Any
    writers: list[Any]
    """The open writers, whose states (a tracker's run id) a checkpoint keeps."""
    hooks: Any
    """Every hook point's caller (``after_load_checkpoint``)."""
    grad_accum: int
    """Batches per accumulation group (a checkpoint inside one keeps its gradients)."""
    optimizer_step: Any
    """The step the loop calls; its ``items`` are the open group's items so far."""

    @property
    def optimizer(self) -> Any: ...

    def recount_position(self) -> None:
        """Set the accumulation facts of a restored position (its optimizer steps)."""

    @property
    def unwrapped_model(self) -> nn.Module: ...

    @property
    def work_dir(self) -> Path: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def strategy(self) -> str: ...

    @property
    def device(self) -> Any:
        """The run's device (a ``torch.device``)."""

    @property
    def by_epoch(self) -> bool: ...

    @property
    def max_iters(self) -> int | None: ...

    @property
    def validation_schedule(self) -> ValidationSchedule:
        """``by_epoch``: whether a validated position closes its epoch (no validation mid-epoch)."""

    @property
    def train_loader(self) -> Any:
        """The train loader as the loops use it (resumable, this rank's share), or None."""

    def stateful_plugins(self) -> dict[str, Any]:
        """The plugins (by name) whose state checkpoints keep."""

    def info(self, message: str) -> None:
        """Print a line on rank 0."""

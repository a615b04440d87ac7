"""What a plugin may use of the runner: the whole contract between the core and a plugin.

Every hook implementation receives the runner; type it as :class:`RunnerProtocol` and mypy
checks that the plugin uses nothing else. The built-in plugins are checked this way. What a
plugin needs and this surface lacks is added here, never reached around.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from torch import nn

    from hookrun.checkpoint.storage import URL
    from hookrun.engine.clock import IterationClock
    from hookrun.engine.position import LoopPosition, ValidationSchedule
    from hookrun.engine.scalars import ScalarStore
    from hookrun.hooks.stats import HookStats
    from hookrun.writers.base import Writer


class RunnerProtocol(Protocol):
    """The runner as plugins see it. Attributes without a setter are read-only."""

    # -- counters and schedule -------------------------------------------------------------

    @property
    def iter(self) -> int:
        """The running iteration's 0-based global index; between iterations (validation,
        ``after_train_epoch``), the number of iterations done."""

    @property
    def epoch(self) -> int:
        """The running epoch (0-based, as a Python loop's index; the console shows it
        plus 1); once its training is over (validation inside ``train()``, after the run)
        the epochs done, so ``after_val_epoch`` reads one more than ``after_train_epoch``
        of the same epoch (docs/concepts.md, Epoch numbers)."""

    @property
    def inner_iter(self) -> int:
        """The running iteration's index within its epoch."""

    @property
    def position(self) -> LoopPosition:
        """The loop position, the one home of the loop's facts: ``epoch``, ``batch``
        (batches done in it), ``iter`` (iterations done) and ``phase`` are saved in
        checkpoints; ``closes_group`` (whether the running iteration ends an accumulation
        group, so an optimizer step follows its backward) and ``optimizer_steps`` (optimizer
        steps taken, a GradScaler-skipped or vetoed one included) are not, they follow from
        the rest. Ask these rather than deriving them from ``grad_accum`` or gradients."""

    @property
    def max_iters(self) -> int | None:
        """Iterations of the whole run (``max_epochs`` times the epoch length when by epoch);
        None in an epoch run over a stream (a loader without ``__len__``) until its first
        epoch has ended."""

    @property
    def max_epochs(self) -> int | None:
        """Epochs of the run (``None`` when ``max_iters`` was given)."""

    @property
    def by_epoch(self) -> bool:
        """Whether the run is measured in epochs (``max_epochs``) rather than iterations."""

    @property
    def val_interval(self) -> int:
        """Validate every this many epochs (iterations in iteration-based runs)."""

    @property
    def validation_schedule(self) -> ValidationSchedule:
        """When validation runs: ``due(done)`` and ``remaining(done)``."""

    @property
    def log_interval(self) -> int:
        """The core reports training scalars every this many iterations."""

    @property
    def grad_accum(self) -> int:
        """Batches per optimizer step (an epoch's last group may be shorter: the position's
        ``closes_group`` says where a group ends)."""

    @property
    def seed(self) -> int:
        """The run's seed."""

    @property
    def mode(self) -> str:
        """What the runner is doing: ``"train"``, ``"val"``, ``"test"``, ``"predict"`` or
        ``"idle"``."""

    def every_n_iters(self, n: int) -> bool:
        """Whether the finishing iteration is the n-th, 2n-th, ... of the run."""

    def every_n_epochs(self, n: int) -> bool:
        """Whether the finishing epoch is the n-th, 2n-th, ... of the run."""

    def is_last_iter(self) -> bool:
        """Whether the finishing iteration is the run's last."""

    def is_last_epoch(self) -> bool:
        """Whether the finishing epoch is the run's last."""

    stop_training: bool
    """Set it to end training after the current iteration (docs/hooks.md)."""

    # -- what is trained -------------------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The model as trained: a DDP wrapper under torch.distributed."""

    @property
    def unwrapped_model(self) -> nn.Module:
        """The user's module itself (weights, buffers, ``state_dict``)."""

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The first optimizer: the only one unless several were named (``None`` for
        evaluation-only runners)."""

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer by name (``"main"`` when one was given), in stepping order; the
        names ``before_optimizer_step``/``after_optimizer_step`` receive."""

    @property
    def scheduler(self) -> Any:
        """The first learning-rate scheduler, or ``None``."""

    @property
    def schedulers(self) -> dict[str, Any]:
        """Every scheduler by its optimizer's name."""

    @property
    def manual(self) -> bool:
        """Whether the model's ``training_step(batch, optim)`` steps the optimizers itself."""

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """AMP's GradScaler under ``amp: fp16``, else ``None``."""

    @property
    def amp(self) -> str | None:
        """``None``, ``"bf16"`` or ``"fp16"``."""

    @property
    def train_dataloader(self) -> Iterable[Any] | None:
        """The training loader as the user gave it."""

    @property
    def val_dataloader(self) -> Iterable[Any] | None:
        """The validation loader as the user gave it."""

    @property
    def test_dataloader(self) -> Iterable[Any] | None:
        """The test loader as the user gave it."""

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's mixed-precision context (a no-op without ``amp``)."""

    def to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor moved to :attr:`device`."""

    def evaluate(self, dataloader: Iterable[Any], mode: str = "val") -> dict[str, float]:
        """Metrics of one pass over ``dataloader`` in eval mode, without calling hooks."""

    def extra_models(self) -> dict[str, Callable[[], Any]]:
        """Other plugins' extra models (an EMA copy...): name to a swap-in context factory."""

    # -- scalars, console, writers ---------------------------------------------------------

    @property
    def scalars(self) -> ScalarStore:
        """Put device tensors here (``put`` for series, ``gauge`` for gauges); the core
        reports them every ``log_interval`` iterations."""

    @property
    def console(self) -> Console:
        """rich console; quiet on ranks other than 0."""

    def info(self, message: str) -> None:
        """A one-line ``[hookrun]`` notice on rank 0's console."""

    writers: list[Writer]
    """Open writers (rank 0, during a run)."""

    def write_scalars(self, scalars: dict[str, float], step: int | None = None) -> None:
        """Host floats to every writer (rank 0); default step: iterations done."""

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config of a CLI run (empty for Python-API runs)."""

    @property
    def plugin_order(self) -> list[tuple[str, object]]:
        """Active plugins and ad-hoc hooks in call order (name, object)."""

    @property
    def clock(self) -> IterationClock:
        """Iteration timings the training loop takes itself (period, data time, samples),
        read by the timer plugin; the loop takes them once a reader has called
        ``clock.keep(size)`` (before training); ``clock.warmup`` sets how many it leaves out
        of the timed totals; under torch.distributed ``clock.slowest_data_time`` is the
        slowest rank's mean data time over the last report interval."""
        ...

    @property
    def hook_stats(self) -> HookStats:
        """Time spent in hook calls: ``total`` always; per (plugin, hook) in ``per_hook``
        while ``profile`` is true (the timer's hook table)."""

    # -- processes and places --------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank (0 outside torch.distributed)."""

    @property
    def world_size(self) -> int:
        """Number of processes."""

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (writers, console and checkpoint files live there)."""

    @property
    def strategy(self) -> str:
        """How the model is shared: ``none`` (one process), ``ddp`` or ``fsdp`` (sharded:
        the model's parameters are ``DTensor`` shards, every collective call on every rank)."""

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether a checkpoint is a folder every rank writes its shards into (FSDP): then
        :meth:`write_checkpoint` is called on every rank, not on rank 0 alone.

        A plugin's ``state_dict()`` may then hold ``DTensor`` shards (in nested dicts): each
        rank's shards go into the folder through DCP, never pickled, and ``load_state_dict``
        gets them back as ``DTensor``s sharded on dim 0 over every rank (how ``fully_shard``
        lays out parameters; resharded when the world size changed), or as whole tensors
        when a run without FSDP loads the folder."""

    @property
    def device(self) -> torch.device:
        """The device the model and batches are on."""

    @property
    def work_dir(self) -> Path:
        """The run's folder."""

    checkpoint_dir: Path | URL
    """Where checkpoints go and ``resume="auto"`` looks: the folder a plugin declares
    (:meth:`Plugin.checkpoint_dir`), else ``<work_dir>/checkpoints``."""

    @property
    def resumed_from(self) -> Path | URL | None:
        """The checkpoint this run resumed from, if any."""

    # -- checkpoints and random state ------------------------------------------------------

    def checkpoint_state(self, save_optimizer: bool = True) -> dict[str, Any]:
        """The full state a checkpoint holds, after ``before_save_checkpoint`` edited it."""

    def write_checkpoint(self, state: dict[str, Any], path: str | Path | URL) -> Path | URL:
        """Write a collected state atomically to ``path`` from this process (with
        :attr:`sharded_checkpoints`, a folder, every rank calling this together)."""

    def save_checkpoint(self, path: str | Path | URL, save_optimizer: bool = True) -> Path | URL:
        """Collect and write a checkpoint (rank 0 writes, every rank waits; every rank
        writes its shards with :attr:`sharded_checkpoints`)."""

    def rng_state(self) -> dict[str, Any]:
        """A snapshot of this process's random generators."""

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Put back a snapshot from :meth:`rng_state`."""

    def rng_preserved(self) -> contextlib.AbstractContextManager[None]:
        """A block after which the random generators are as they were before it."""

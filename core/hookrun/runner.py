"""The Runner: training, validation and test loops that call the hook points in order.

The training loop is one state machine over a saved position (epoch, batch, phase), which
is what makes mid-epoch resume exact; it is kept whole in this file.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from hookrun import checkpoint as ckpt_io
from hookrun import dist
from hookrun import state as run_state
from hookrun.arguments import check_arguments, resolve_device
from hookrun.data import make_loader, seed_all, shard_sampler, train_sampler
from hookrun.errors import CheckpointError, ConfigError
from hookrun.manager import PluginManager
from hookrun.scalars import ScalarStore
from hookrun.steps import (
    MetricMeans,
    batch_size,
    check_convention,
    evaluation_values,
    to_device,
    training_losses,
)
from hookrun.writers import Writer, open_writers, resolve_writers

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Runner:
    """Trains ``model`` with the given data and optimizer, calling every hook point in order."""

    def __init__(
        self,
        model: nn.Module,
        train_dataloader: Iterable[Any] | None = None,
        val_dataloader: Iterable[Any] | None = None,
        test_dataloader: Iterable[Any] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        criterion: Callable[..., torch.Tensor] | None = None,
        metrics: Mapping[str, Callable[..., Any]] | None = None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        val_interval: int = 1,
        work_dir: str | Path = "runs/exp",
        plugins: Mapping[str, Any] | None = None,
        hooks: Iterable[object] = (),
        writers: Any = ("jsonl", "tensorboard"),
        device: str | torch.device = "auto",
        amp: str | None = None,
        grad_accum: int = 1,
        clip_grad: float | Mapping[str, float] | None = None,
        seed: int = 0,
        scheduler_interval: str = "epoch",
        ddp: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        check_arguments(max_epochs, max_iters, val_interval, amp, grad_accum, scheduler_interval)
        check_convention(model, criterion)
        self.seed = seed
        seed_all(seed)
        self.rank, self.world_size, local_rank = dist.init_from_env()
        self.device = resolve_device(device, local_rank)
        if amp == "fp16" and self.device.type != "cuda":
            raise ConfigError("runner.amp: 'fp16' needs a CUDA device; use 'bf16' on CPU")
        self.unwrapped_model = model.to(self.device)
        self._training_step = getattr(model, "training_step", None)
        self.model: nn.Module = self.unwrapped_model
        if self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(model, device_ids=ids, **(ddp or {}))
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.criterion = criterion
        self.metrics = dict(metrics or {})
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.test_dataloader = test_dataloader
        self._loaders = {
            "train": make_loader(train_dataloader, seed, train_sampler(train_dataloader, seed)),
            "val": make_loader(val_dataloader, seed, shard_sampler(val_dataloader)),
            "test": make_loader(test_dataloader, seed, shard_sampler(test_dataloader)),
        }
        self.max_epochs = max_epochs if max_epochs is not None or max_iters else 10
        self._max_iters = max_iters
        self.by_epoch = max_iters is None
        self.val_interval = val_interval
        self.work_dir = Path(work_dir)
        self.checkpoint_dir = self.work_dir / "checkpoints"
        self.amp = amp
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
        self.grad_accum = grad_accum
        self.clip_grad = (
            {"max_norm": clip_grad} if isinstance(clip_grad, (int, float)) else clip_grad
        )
        self.config = dict(config or {})
        self.console = Console(quiet=self.rank != 0, highlight=False)
        self.manager = PluginManager(plugins, hooks)
        self.plugins = self.manager.plugins
        self.hooks = self.manager.hooks
        for notice in self.manager.notices:
            self.info(notice)
        self.scalars = ScalarStore()
        self.writers: list[Writer] = []
        self._writer_classes = resolve_writers(writers)
        self.iter = 0
        self.epoch = 0
        self.inner_iter = 0
        self.stop_training = False
        self.mode = "idle"
        self.resumed_from: Path | None = None
        self.last_metrics: dict[str, dict[str, float]] = {}
        self._pos: dict[str, Any] = {"epoch": 0, "batch": 0, "phase": "train", "iter": 0}
        self._depth = 0

    # -- counters and helpers ------------------------------------------------------------

    @property
    def max_iters(self) -> int:
        if self._max_iters is not None:
            return self._max_iters
        loader = self._loaders["train"]
        return (self.max_epochs or 0) * (len(loader) if loader is not None else 0)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def every_n_iters(self, n: int) -> bool:
        return n > 0 and (self.iter + 1) % n == 0

    def every_n_epochs(self, n: int) -> bool:
        return n > 0 and (self.epoch + 1) % n == 0

    def is_last_iter(self) -> bool:
        return self.iter + 1 == self.max_iters

    def is_last_epoch(self) -> bool:
        if self.by_epoch:
            return self.epoch + 1 == self.max_epochs
        loader = self._loaders["train"]
        per_epoch = len(loader) if loader is not None else 1
        return self.epoch + 1 == -(-self.max_iters // per_epoch)

    def info(self, message: str) -> None:
        """A one-line notice on rank 0's console."""
        self.console.print(f"[hookrun] {message}", markup=False, soft_wrap=True)

    def write_scalars(self, scalars: Mapping[str, float], step: int | None = None) -> None:
        """Send host floats to every writer (rank 0 only); the default step is the number of
        completed iterations."""
        if self.is_main and scalars:
            for writer in self.writers:
                writer.write_scalars(scalars, self._pos["iter"] if step is None else step)

    # -- public entry points -------------------------------------------------------------

    def train(self, resume: str | Path | None = None) -> None:
        """Train from scratch, from ``resume`` (a path), or from the newest checkpoint ("auto")."""
        if self._loaders["train"] is None or self.optimizer is None:
            raise ConfigError("runner.train: train_dataloader and optimizer are required")
        with self._run("train"):
            self.hooks.before_run(runner=self)
            if resume is not None:
                self._resume(resume)
            self.hooks.before_train(runner=self)
            self._train_loop()
            self.hooks.after_train(runner=self)
            self.hooks.after_run(runner=self)

    def val(self) -> dict[str, float]:
        """Evaluate on ``val_dataloader`` with the current weights."""
        return self._evaluate_alone("val")

    def test(self) -> dict[str, float]:
        """Evaluate on ``test_dataloader`` with the current weights."""
        return self._evaluate_alone("test")

    def evaluate(self, dataloader: Iterable[Any], mode: str = "val") -> dict[str, float]:
        """Metrics of ``dataloader`` without calling any hook (for plugins that need a pass)."""
        loader = make_loader(dataloader, self.seed, shard_sampler(dataloader))
        return self._evaluation_loop(loader, mode, hooks=False)

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint_state(self, save_optimizer: bool = True) -> dict[str, Any]:
        """Everything a checkpoint holds, after ``before_save_checkpoint`` edited it."""
        state = run_state.collect(self, save_optimizer)
        self.hooks.before_save_checkpoint(runner=self, checkpoint=state)
        return state

    def save_checkpoint(self, path: str | Path, save_optimizer: bool = True) -> Path:
        """Write a checkpoint atomically (rank 0 writes, every rank waits for it)."""
        path = Path(path)
        state = self.checkpoint_state(save_optimizer)
        error = None
        if self.is_main:
            try:
                ckpt_io.write(state, path)
            except CheckpointError as exc:
                error = exc
        if dist.any_rank(error is not None) and error is None:  # every rank waits, all fail
            error = CheckpointError(f"rank 0 could not write checkpoint {path}")
        if error is not None:
            raise error
        return path

    def load_checkpoint(self, path: str | Path, resume: bool = True) -> dict[str, Any]:
        """Load weights (``resume=False``) or the whole training state (``resume=True``)."""
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {path}")
        try:
            checkpoint = ckpt_io.load(path)
        except Exception as exc:
            raise CheckpointError(
                f"cannot load checkpoint {path}: {type(exc).__name__}: {exc}"
            ) from exc
        self._restore(checkpoint, resume)
        return checkpoint

    def _resume(self, resume: str | Path) -> None:
        if str(resume) == "auto":
            found = ckpt_io.newest_loadable(self.checkpoint_dir, self.info)
            if found is None:
                self.info(f"no checkpoint in {self.checkpoint_dir}; starting fresh")
                return
            path, checkpoint = found
            self._restore(checkpoint, resume=True)
        else:
            path = Path(resume)
            self.load_checkpoint(path, resume=True)
        self.resumed_from = path
        self.info(f"resumed from {path} at iteration {self.iter}")

    def _restore(self, checkpoint: dict[str, Any], resume: bool) -> None:
        run_state.restore(self, checkpoint, resume)
        self.hooks.after_load_checkpoint(runner=self, checkpoint=checkpoint)

    # -- loops ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _run(self, mode: str) -> Any:
        """Open writers, set the mode, report exceptions to ``on_exception``, close writers."""
        outer = self._depth == 0
        self._depth += 1
        previous, self.mode = self.mode, mode
        if outer and self.is_main and not self.writers:
            self.writers = open_writers(self._writer_classes, self.work_dir)
        try:
            yield
        except BaseException as exc:
            if outer:
                self._on_exception(exc)
            raise
        finally:
            self._depth -= 1
            self.mode = previous
            if outer:
                for writer in self.writers:
                    writer.close()
                self.writers = []

    def _on_exception(self, exc: BaseException) -> None:
        kwargs = {"runner": self, "exception": exc}
        for impl in self.hooks.on_exception.impls:
            try:
                impl.call(kwargs)
            except Exception as hook_exc:  # never hide the original exception
                print(
                    f"[hookrun] on_exception of {impl.owner!r} failed: {hook_exc!r}",
                    file=sys.stderr,
                )

    def _train_loop(self) -> None:
        loader = self._loaders["train"]
        assert loader is not None
        per_epoch = len(loader)
        if per_epoch == 0:
            raise ConfigError("train_dataloader: yields no batches")
        pos = self._pos
        pending_val = (
            not self.by_epoch and pos["phase"] == "train" and self._iter_val_due(pos["iter"])
        )
        self.stop_training = False
        while not self._finished():
            self.epoch = pos["epoch"]
            if pos["phase"] == "train" or (not self.by_epoch and pos["phase"] == "validated"):
                if pending_val:
                    self._validate()
                    pending_val = False
                if pos["batch"] < per_epoch and not self.stop_training and not self._iters_done():
                    self.unwrapped_model.train()
                    self.hooks.before_train_epoch(runner=self)
                    self._train_epoch(loader, pos["batch"], per_epoch)
                self._end_epoch(per_epoch)
            if self._epoch_val_pending():
                self._validate()
            if self.stop_training or self._iters_done():
                break
            self._pos = pos = {
                "epoch": pos["epoch"] + 1,
                "batch": 0,
                "phase": "train",
                "iter": pos["iter"],
            }

    def _finished(self) -> bool:
        """Whether the position restored (or reached) leaves nothing to do."""
        pos = self._pos
        if self.by_epoch:
            return pos["epoch"] >= self.max_epochs or (
                pos["epoch"] + 1 == self.max_epochs and pos["phase"] == "validated"
            )
        return pos["iter"] >= self.max_iters and pos["phase"] != "train"

    def _iters_done(self) -> bool:
        return not self.by_epoch and self._pos["iter"] >= self.max_iters

    def _iter_val_due(self, done: int) -> bool:
        if self.by_epoch or done == 0 or self._loaders["val"] is None:
            return False
        return done % self.val_interval == 0 or done == self.max_iters

    def _epoch_val_pending(self) -> bool:
        pos = self._pos
        if not self.by_epoch or pos["phase"] != "trained" or self.stop_training:
            return False
        epoch = pos["epoch"] + 1
        due = epoch % self.val_interval == 0 or epoch == self.max_epochs
        return due and self._loaders["val"] is not None

    def _train_epoch(self, loader: Any, skip: int, per_epoch: int) -> None:
        hooks, pos, device = self.hooks, self._pos, self.device
        move = device.type != "cpu"  # loaders yield CPU tensors; moving them to CPU is a no-op
        by_iters = not self.by_epoch  # only iteration-based runs validate or end mid-epoch
        for batch_idx, batch in enumerate(loader.epoch_iter(pos["epoch"], skip), start=skip):
            self.inner_iter = batch_idx
            if move:
                batch = to_device(batch, device)
            hooks.before_train_iter(runner=self, batch_idx=batch_idx, batch=batch)
            outputs = self._train_step(batch, batch_idx, per_epoch)
            hooks.after_train_iter(runner=self, batch_idx=batch_idx, batch=batch, outputs=outputs)
            self.iter = pos["iter"]
            if by_iters and self._iter_val_due(pos["iter"]):
                self._validate()
            if self.stop_training or (by_iters and self._iters_done()):
                break

    def _train_step(self, batch: Any, batch_idx: int, per_epoch: int) -> dict[str, torch.Tensor]:
        optimizer = self.optimizer
        assert optimizer is not None
        boundary = (batch_idx + 1) % self.grad_accum == 0 or batch_idx + 1 == per_epoch
        model, module, step = self.model, self.unwrapped_model, self._training_step
        if self.amp is None and self.world_size == 1:  # the common case, without context managers
            losses = training_losses(model, module, step, self.criterion, batch)
            loss = losses["loss"]
            (loss / self.grad_accum if self.grad_accum > 1 else loss).backward()
        else:
            sync = (
                contextlib.nullcontext() if boundary or self.world_size == 1 else model.no_sync()  # type: ignore[operator]
            )
            with sync, self._autocast():
                losses = training_losses(model, module, step, self.criterion, batch)
            loss = losses["loss"] / self.grad_accum if self.grad_accum > 1 else losses["loss"]
            with sync:
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if boundary:
            if self.clip_grad:
                if self.scaler is not None:
                    self.scaler.unscale_(optimizer)
                norm = nn.utils.clip_grad_norm_(self.unwrapped_model.parameters(), **self.clip_grad)  # type: ignore[arg-type]
                self.scalars.put("train/grad_norm", norm)
            if self.scaler is not None:
                self.scaler.step(optimizer)
                self.scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if self.scheduler is not None and self.scheduler_interval == "iter":
                self.scheduler.step()
        pos = self._pos
        pos["batch"] = batch_idx + 1
        pos["iter"] += 1
        pos["phase"] = "train"
        outputs = {name: value.detach() for name, value in losses.items()}
        self.scalars.update(outputs, prefix="train/")
        return outputs

    def _end_epoch(self, per_epoch: int) -> None:
        """Close an epoch; one cut short by ``stop_training`` stays resumable mid-epoch."""
        pos = self._pos
        complete = pos["batch"] >= per_epoch
        if complete and self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()
        if complete or self._iters_done():
            pos["phase"] = "trained"
        dist.broadcast_buffers(self.unwrapped_model)
        self.hooks.after_train_epoch(runner=self)
        self.epoch = self._pos["epoch"] + 1

    def _validate(self) -> None:
        loader = self._loaders["val"]
        assert loader is not None
        self._evaluation_loop(loader, "val", hooks=True)  # restores the training mode
        self._pos["phase"] = "validated"

    def _evaluate_alone(self, mode: str) -> dict[str, float]:
        loader = self._loaders[mode]
        if loader is None:
            raise ConfigError(f"runner.{mode}: no {mode}_dataloader was given")
        with self._run(mode):
            self.hooks.before_run(runner=self)
            metrics = self._evaluation_loop(loader, mode, hooks=True)
            self.hooks.after_run(runner=self)
        return metrics

    def _evaluation_loop(self, loader: Any, mode: str, hooks: bool) -> dict[str, float]:
        call = getattr if hooks else _no_hook
        before_iter = call(self.hooks, f"before_{mode}_iter")
        after_iter = call(self.hooks, f"after_{mode}_iter")
        if hooks:
            getattr(self.hooks, f"before_{mode}")(runner=self)
            getattr(self.hooks, f"before_{mode}_epoch")(runner=self)
        was_training = self.unwrapped_model.training
        dist.broadcast_buffers(self.unwrapped_model)
        self.unwrapped_model.eval()
        means = MetricMeans(self.device)
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader.epoch_iter(0)):
                batch = to_device(batch, self.device)
                before_iter(runner=self, batch_idx=batch_idx, batch=batch)
                with self._autocast():
                    values = evaluation_values(
                        self.unwrapped_model, self.criterion, self.metrics, batch, mode
                    )
                means.add(values, batch_size(batch))
                after_iter(runner=self, batch_idx=batch_idx, batch=batch, outputs=values)
        self.unwrapped_model.train(was_training)
        metrics = means.result()
        if hooks:
            getattr(self.hooks, f"after_{mode}_epoch")(runner=self, metrics=metrics)
            self.last_metrics[mode] = dict(metrics)
            self.write_scalars({f"{mode}/{k}": v for k, v in metrics.items()})
            getattr(self.hooks, f"after_{mode}")(runner=self)
        return metrics

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])


def _no_hook(_hooks: object, _name: str) -> Callable[..., None]:
    return lambda **kwargs: None

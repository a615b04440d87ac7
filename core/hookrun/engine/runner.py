"""The Runner: a facade over the training loop (:mod:`hookrun.engine.train_loop`),
evaluation (:mod:`hookrun.engine.evaluation`), the optimizer step
(:mod:`hookrun.engine.optimizer_step`), reporting (:mod:`hookrun.engine.reporting`) and
checkpoints.

What plugins may use of it is :class:`hookrun.RunnerProtocol` (:mod:`hookrun.hooks.protocol`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from torch import nn

from hookrun.checkpoint import files as ckpt_io
from hookrun.checkpoint import random_state
from hookrun.checkpoint import resume as run_resume
from hookrun.checkpoint import state as run_state
from hookrun.checkpoint.storage import URL, location
from hookrun.config.arguments import check_arguments
from hookrun.config.devices import device_feature_errors, resolve_device
from hookrun.data.batches import to_device
from hookrun.data.limits import limited
from hookrun.data.loaders import make_loader, seed_all
from hookrun.data.sharding import train_sampler
from hookrun.distributed import collectives, process_group
from hookrun.distributed.fsdp import shard_model
from hookrun.engine import compiled, workdir, workdir_hold
from hookrun.engine import predict as prediction
from hookrun.engine.clock import IterationClock
from hookrun.engine.evaluation import evaluate, evaluation_loaders
from hookrun.engine.optimizer_step import OptimizerStep, named_optimizers
from hookrun.engine.position import DEFAULT_MAX_EPOCHS, LoopPosition, Phase, ValidationSchedule
from hookrun.engine.reporting import Reporter
from hookrun.engine.scalars import ScalarStore
from hookrun.engine.steps import is_manual
from hookrun.engine.stop_signals import DEFAULT_STOP_SIGNALS, StopSignals
from hookrun.engine.train_loop import TrainLoop
from hookrun.errors import CheckpointError, ConfigError
from hookrun.hooks.manager import PluginManager
from hookrun.hooks.stats import HookStats
from hookrun.writers.base import Writer, run_status
from hookrun.writers.lifecycle import close_writers, open_writers
from hookrun.writers.registry import resolve_writers

if TYPE_CHECKING:
    from hookrun.checkpoint.checkpointable import Checkpointable
    from hookrun.hooks.protocol import RunnerProtocol

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_step(manual: bool, optimizers: int, grad_accum: int, strategy: str) -> None:
    """Refuse what manual optimization and several optimizers do not support (one line)."""
    if manual and grad_accum > 1:
        raise ConfigError(
            "runner.grad_accum: a training_step(batch, optim) steps when it calls optim.step; "
            "accumulate there (call optim.step every N batches) and keep grad_accum 1"
        )
    if strategy == "fsdp" and (manual or optimizers > 1):
        raise ConfigError(
            "runner.strategy: fsdp trains with one optimizer in automatic optimization; use "
            "ddp (strategy auto) for several optimizers or a training_step(batch, optim)"
        )


class Runner:
    """Trains ``model`` with the given data and optimizer, calling every hook point in order.

    The arguments are the config file's ``runner:`` keys (docs/config.md) plus what a task
    builds. Everything a plugin may read is :class:`hookrun.RunnerProtocol`, which documents
    the counters, models, scalars and folders this class also has; the rest is here.

    Attributes:
        criterion: The loss function given (``None`` when the model returns its loss).
        metrics: Name to ``metric(outputs, targets)``, computed on every evaluation batch.
        scheduler_interval: ``"epoch"`` or ``"iter"``: when the scheduler steps.
        clip_grad: Keyword arguments of ``clip_grad_norm_`` (``None``: no clipping).
        stop_signals: The signals that stop training at the next iteration boundary.
        dist_timeout: Seconds a collective call may wait under torch.distributed.
        plugins: The active plugins by name (after selection and ``unused_hooks``).
        hooks: Every hook point's caller: ``runner.hooks.after_train_iter(runner=...)``.
        manager: The plugin manager that found, validated and ordered the plugins.
        predict_dataloader: What :meth:`predict` predicts over by default (else
            ``test_dataloader``).
        last_metrics: The latest metrics of each mode (``"val"``, ``"test"``); with named sets
            the names are ``<set>/<metric>``.
        optimizers: The optimizers by name (``"main"`` when one was given).
        schedulers: The schedulers by their optimizer's name.
        manual: Whether the model's ``training_step(batch, optim)`` steps the optimizers
            itself (manual optimization).
        optimizer_step: The step the training loop calls (AMP, accumulation, clipping); the
            ``optim`` a manual ``training_step`` receives.
        reporter: Reads ``scalars`` every ``log_interval`` iterations and writes them out.
        val_every_n_iters: Validate every this many iterations of an epoch run (``None``: at
            epoch ends); :attr:`validation_schedule` says when.
        limits: ``(limit_train_batches, limit_val_batches)``, each ``None`` for all batches.
    """

    def __init__(
        self,
        model: nn.Module,
        train_dataloader: Iterable[Any] | None = None,
        val_dataloader: Iterable[Any] | None = None,
        test_dataloader: Iterable[Any] | None = None,
        predict_dataloader: Iterable[Any] | None = None,
        optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer] | None = None,
        scheduler: Any = None,
        criterion: Callable[..., torch.Tensor] | None = None,
        metrics: Mapping[str, Callable[..., Any]] | None = None,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        val_interval: int = 1,
        val_every_n_iters: int | None = None,
        limit_train_batches: int | None = None,
        limit_val_batches: int | None = None,
        work_dir: str | Path = "runs/exp",
        plugins: Mapping[str, Any] | None = None,
        hooks: Iterable[object] = (),
        writers: Any = ("jsonl", "tensorboard"),
        device: str | torch.device = "auto",
        amp: str | None = None,
        grad_accum: int = 1,
        grad_accum_normalize: str = "batches",
        clip_grad: float | Mapping[str, float] | None = None,
        seed: int = 0,
        scheduler_interval: str = "epoch",
        log_interval: int | None = None,
        strategy: str = "auto",
        dist_timeout: float = 600.0,
        sync_bn: bool = False,
        compile: bool | Mapping[str, Any] = False,
        ddp: Mapping[str, Any] | None = None,
        fsdp: Mapping[str, Any] | None = None,
        stop_signals: Sequence[str] = DEFAULT_STOP_SIGNALS,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        args = check_arguments(
            max_epochs=max_epochs,
            max_iters=max_iters,
            val_interval=val_interval,
            val_every_n_iters=val_every_n_iters,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            work_dir=work_dir,
            seed=seed,
            device=device,
            amp=amp,
            grad_accum=grad_accum,
            grad_accum_normalize=grad_accum_normalize,
            clip_grad=clip_grad,
            scheduler_interval=scheduler_interval,
            writers=writers,
            log_interval=10 if log_interval is None else log_interval,
            strategy=strategy,
            dist_timeout=dist_timeout,
            sync_bn=sync_bn,
            compile=compile,
            ddp=ddp,
            fsdp=fsdp,
            stop_signals=list(stop_signals),
        )
        self.seed = seed
        seed_all(seed)
        self.rank, self.world_size, local_rank = process_group.init_from_env(dist_timeout)
        self.stop_signals = StopSignals(args.stop_signals)
        self.dist_timeout = dist_timeout
        self.strategy = "fsdp" if strategy == "fsdp" else "ddp" if self.world_size > 1 else "none"
        with process_group.errors_agreed():  # a mistake found on one rank ends every rank
            self.optimizers, self.schedulers = named_optimizers(optimizer, scheduler)
            self.manual = is_manual(getattr(model, "training_step", None))
            check_step(self.manual, len(self.optimizers), grad_accum, strategy)
            if strategy == "fsdp" and self.world_size == 1:
                raise ConfigError(
                    "runner.strategy: 'fsdp' shards the model over processes and this run has "
                    "one; start it with torchrun --nproc-per-node=N (N > 1), or use strategy auto"
                )
            self.device = resolve_device(device, local_rank)
            errors = device_feature_errors(amp, sync_bn, strategy, self.device)
            if errors:
                raise ConfigError(errors)
            self.limits = (limit_train_batches, limit_val_batches)
            self._loaders = self._wrap_loaders(train_dataloader, val_dataloader, test_dataloader)
        if sync_bn and self.world_size > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        # compiled in place before DDP wraps it: plain names, a compiled training_step;
        # under FSDP each innermost unit's forward, once sharded
        sharded = self.strategy == "fsdp"
        model = compiled.prepare(model, False if sharded else args.compile).to(self.device)
        self.unwrapped_model = model
        self.model: nn.Module = model
        if sharded:
            self.model = shard_model(model, self.optimizer, args.fsdp, self.device, amp)
            compiled.compile_sharded(model, args.compile)
        elif self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(model, device_ids=ids, **(ddp or {}))
        self.scheduler_interval = scheduler_interval
        self.criterion = criterion
        self.metrics = dict(metrics or {})
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.test_dataloader = test_dataloader
        self.predict_dataloader = predict_dataloader
        self.max_epochs = max_epochs if max_epochs is not None or max_iters else DEFAULT_MAX_EPOCHS
        self._max_iters = max_iters
        self.by_epoch = max_iters is None
        self.val_interval = val_interval
        self.val_every_n_iters = val_every_n_iters
        self.work_dir = Path(args.work_dir)  # `~` expanded, as in a config file
        self.amp = amp
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
        self.grad_accum = grad_accum
        self.clip_grad = args.clip_grad_norm
        self.config = dict(config or {})
        self.console = Console(quiet=self.rank != 0, highlight=False)
        self.manager = PluginManager(plugins, hooks)
        if log_interval is None:  # one knob: the logger's interval when it sets one, else 10
            reported = self.manager.report_interval()
            log_interval = 10 if reported is None else reported[1]
        self.plugins = self.manager.plugins
        self.hooks = self.manager.hooks
        self.checkpoint_dir = workdir.checkpoint_dirs(self.work_dir, self.plugins.values())[-1]
        for notice in self.manager.notices:
            self.info(notice)
        self.hook_stats: HookStats = self.manager.stats
        # on the CPU a read costs nothing: values are read one by one, not stacked first
        self.scalars = ScalarStore(window=max(100, log_interval), batched=self.device.type != "cpu")
        self.writers: list[Writer] = []
        self._writer_classes = resolve_writers(writers)
        self.log_interval = log_interval
        self.position = LoopPosition()
        self.stop_training = False
        self.mode = "idle"
        self.resumed_from: Path | URL | None = None
        self.last_metrics: dict[str, dict[str, float]] = {}
        self.manager.drop_unused(self)
        self.optimizer_step = OptimizerStep(
            self,
            self.hooks,
            self.scalars,
            grad_accum,
            self.clip_grad,
            self.scaler,
            grad_accum_normalize,
        )
        self.clock = IterationClock()
        self.reporter = Reporter(self, log_interval)  # its pace reads the clock
        self._depth = 0

    def _wrap_loaders(self, train: Any, val: Any, test: Any) -> dict[str, Any]:
        """The loaders as the loops use them: resumable, each rank's share of the samples
        (the user's samplers kept and sharded, :mod:`hookrun.data.sharding`)."""
        quiet = self.stop_signals.numbers  # left to the main process by loader workers
        where = (self.seed, self.rank, self.world_size)
        loaders = {
            "train": make_loader(
                train,
                self.seed,
                train_sampler(train, "train_dataloader", *where, pad=self.strategy == "fsdp"),
                quiet,
                stateful=True,
            )
        }
        loaders["train"] = limited(loaders["train"], self.limits[0])
        for mode, loader in (("val", val), ("test", test)):
            loaders[mode] = evaluation_loaders(loader, f"{mode}_dataloader", self)
        return loaders

    # -- counters and helpers ------------------------------------------------------------

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The first optimizer (the only one, unless ``optimizer=`` named several)."""
        return next(iter(self.optimizers.values()), None)

    @property
    def scheduler(self) -> Any:
        """The first scheduler (the only one, unless ``scheduler=`` named several)."""
        return next(iter(self.schedulers.values()), None)

    @property
    def train_loader(self) -> Any:
        """The train loader as the loops use it (resumable, this rank's share), or None."""
        return self._loaders["train"]

    def stateful_plugins(self) -> dict[str, Any]:
        """The active plugins and hooks (by name) whose state checkpoints keep."""
        return self.manager.stateful()

    @property
    def iter(self) -> int:
        """The running iteration's 0-based index; between iterations, the iterations done."""
        pos = self.position
        return pos.iter - 1 if pos.iter_ending else pos.iter

    @property
    def epoch(self) -> int:
        """The running epoch (0-based, as a Python loop's index; the console shows it
        plus 1); once its training is over (validation inside ``train()``, after the run)
        the epochs done, so ``after_val_epoch`` reads one more than ``after_train_epoch``
        of the same epoch (docs/concepts.md, Epoch numbers)."""
        pos = self.position
        if pos.phase is Phase.TRAIN:  # mid-epoch (every report): nothing else to ask
            return pos.epoch
        closed = pos.epoch_closed(self.validation_schedule.by_epoch) and not pos.epoch_ending
        return pos.epoch + 1 if closed else pos.epoch

    @property
    def inner_iter(self) -> int:
        """The running iteration's index within its epoch."""
        pos = self.position
        return pos.batch - 1 if pos.iter_ending else pos.batch

    @property
    def validation_schedule(self) -> ValidationSchedule:
        has_val = self._loaders["val"] is not None
        if self.val_every_n_iters is not None:  # an epoch run validating by iterations
            return ValidationSchedule(False, self.val_every_n_iters, self.max_iters or 0, has_val)
        last = self.max_epochs if self.by_epoch else self.max_iters
        return ValidationSchedule(self.by_epoch, self.val_interval, last or 0, has_val)

    @property
    def plugin_order(self) -> list[tuple[str, object]]:
        """Active plugins and ad-hoc hooks in call order (name, object)."""
        return list(self.manager.ordered)

    @property
    def max_iters(self) -> int | None:
        """None in an epoch run over a stream whose first epoch has not ended yet."""
        if self._max_iters is not None:
            return self._max_iters
        per_epoch = self._batches_per_epoch()
        return None if per_epoch is None else (self.max_epochs or 0) * per_epoch

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def every_n_iters(self, n: int) -> bool:
        return n > 0 and (self.iter + 1) % n == 0

    def every_n_epochs(self, n: int) -> bool:
        return n > 0 and (self.position.epoch + 1) % n == 0

    def is_last_iter(self) -> bool:
        if not self.by_epoch:
            return self.iter + 1 == self.max_iters
        # the last batch of the last epoch, not max_epochs * len(loader): an epoch continued
        # on another number of ranks has another number of iterations; a stream's epoch
        # has no last batch until its iterator has ended
        loader = self._loaders["train"]
        if loader is not None and loader.stream:
            return False
        return self.is_last_epoch() and self.inner_iter + 1 == self._batches_per_epoch()

    def is_last_epoch(self) -> bool:
        # the epoch finishing is the position's: during validation inside training
        # ``runner.epoch`` already counts it as done
        epoch = self.position.epoch
        if self.by_epoch:
            return epoch + 1 == self.max_epochs
        per_epoch = self._batches_per_epoch()
        return per_epoch is not None and epoch + 1 == -(-(self.max_iters or 0) // per_epoch)

    def recount_position(self) -> None:
        """Set the accumulation facts of a restored position with this run's epoch length
        (none for a stream: its epoch ends when its iterator does)."""
        loader = self._loaders["train"]
        per_epoch = None if loader is not None and loader.stream else self._batches_per_epoch()
        self.position.recount(per_epoch, self.grad_accum, list(self.optimizers), self.manual)

    def _batches_per_epoch(self) -> int | None:
        """The train loader's length (1 without a loader: the epoch arithmetic's divisor);
        a stream's is None until its first epoch ended."""
        loader = self._loaders["train"]
        return loader.length if loader is not None else 1

    def info(self, message: str) -> None:
        """A one-line notice on rank 0's console."""
        self.console.print(f"[hookrun] {message}", markup=False, soft_wrap=True)

    def write_scalars(self, scalars: Mapping[str, float], step: int | None = None) -> None:
        """Send host floats to every writer (rank 0 only); the default step is the number of
        completed iterations."""
        if self.is_main and scalars:
            for writer in self.writers:
                writer.write_scalars(scalars, self.position.iter if step is None else step)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The run's mixed-precision context (``amp``), a no-op without AMP."""
        if self.amp is None or self.strategy == "fsdp":  # FSDP2's policy casts instead
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    def to_device(self, batch: Any) -> Any:
        """``batch`` (tensors nested in lists, tuples, dicts) moved to the runner's device."""
        return to_device(batch, self.device)

    def rng_state(self) -> dict[str, Any]:
        """A snapshot of every random generator (python, numpy, torch, CUDA) of this process."""
        return random_state.rng_state()

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Put back a snapshot taken with :meth:`rng_state`."""
        random_state.set_rng_state(state)

    @contextlib.contextmanager
    def rng_preserved(self) -> Iterator[None]:
        """Run a block without changing what the run draws afterwards."""
        state = self.rng_state()
        try:
            yield
        finally:
            self.set_rng_state(state)

    def extra_models(self) -> dict[str, Callable[[], Any]]:
        """Every plugin's extra models (``extra_models`` hook), name to swap-in factory."""
        found: dict[str, Callable[[], Any]] = {}
        for models in self.hooks.extra_models(runner=self):
            found.update(models)
        return found

    # -- public entry points -------------------------------------------------------------

    def train(self, resume: str | Path | None = None) -> None:
        """Train from scratch, from ``resume`` (a path), or from the newest checkpoint ("auto").

        Refused before anything is written (:func:`hookrun.checkpoint.resume.check_start`):
        a work dir
        another run holds, one that holds a run without ``resume``, a checkpoint that cannot
        continue the run, a train loader without batches."""
        if self._loaders["train"] is None or not self.optimizers:
            raise ConfigError("runner.train: train_dataloader and optimizer are required")
        stop = self.stop_signals
        if not stop.install(self.world_size, self.dist_timeout, lambda: self.position.iter):
            self.info("not in the main thread: stop signals are left alone")
        # one run per work dir: another run's lock is refused before the writers open, and so
        # is every other mistake (a folder left by a refused start is removed again)
        lock = workdir_hold.hold(self.work_dir, self.is_main, "use another work_dir", self.info)
        try:
            with lock:
                with process_group.errors_agreed():
                    leftovers = run_resume.check_start(self, resume)
                line = workdir.start_over(self.work_dir, leftovers) if self.is_main else None
                if line:
                    self.info(line)
                self._train(resume)
        finally:
            for loaders in self._loaders.values():
                for loader in loaders.values() if isinstance(loaders, dict) else [loaders]:
                    if loader is not None:
                        loader.close()  # persistent workers that ignore stop signals
            stop.restore()
        stop.redeliver()  # after every after_run and the writers' close

    def _train(self, resume: str | Path | None) -> None:
        with self._run("train"):
            self.clock.start()
            self.hooks.before_run(runner=self)
            if resume is not None:
                run_resume.resume(self, resume)
            self.hooks.before_train(runner=self)
            TrainLoop(self).run()
            self.hooks.after_train(runner=self)
            self.hooks.after_run(runner=self)

    def val(self) -> dict[str, float]:
        """Evaluate on ``val_dataloader`` with the current weights."""
        return self._evaluate_alone("val")

    def test(self) -> dict[str, float]:
        """Evaluate on ``test_dataloader`` with the current weights."""
        return self._evaluate_alone("test")

    def predict(self, dataloader: Iterable[Any] | None = None) -> Any:
        """The model's outputs over ``dataloader`` (default: ``predict_dataloader``, else
        ``test_dataloader``) in its order, each sample once, with the current weights: its
        ``predict_step(batch)``, else the forward, in eval mode without gradients. Nothing
        goes to metrics or writers; docs/predict.md says how batches are put together."""
        if dataloader is None:
            dataloader = self.predict_dataloader
        if dataloader is None:
            dataloader = self.test_dataloader
        if dataloader is None:
            raise ConfigError(
                "runner.predict: no dataloader given and no predict_dataloader or test_dataloader"
            )
        return prediction.predict(self, dataloader)

    def evaluate(
        self, dataloader: Iterable[Any] | Mapping[str, Iterable[Any]], mode: str = "val"
    ) -> dict[str, float]:
        """Metrics of ``dataloader`` without calling any hook (for plugins that need a pass);
        of a mapping of named sets, ``<name>/<metric>`` as validation reports them."""
        return evaluate(self, evaluation_loaders(dataloader, "dataloader", self), mode, hooks=False)

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint_state(self, save_optimizer: bool = True) -> dict[str, Any]:
        """Everything a checkpoint holds, after ``before_save_checkpoint`` edited it."""
        state = run_state.collect(self, save_optimizer)
        self.hooks.before_save_checkpoint(runner=self, checkpoint=state)
        return state

    @property
    def sharded_checkpoints(self) -> bool:
        """Whether checkpoints are folders written by every rank together (FSDP)."""
        return self.strategy == "fsdp"

    def write_checkpoint(self, state: dict[str, Any], path: str | Path | URL) -> Path | URL:
        """Write a collected state atomically to ``path`` (this process only; values are
        checked to load with ``weights_only=True``); with :attr:`sharded_checkpoints` a
        folder, and every rank calls this."""
        return run_state.write(self, state, location(path))

    def save_checkpoint(self, path: str | Path | URL, save_optimizer: bool = True) -> Path | URL:
        """Write a checkpoint atomically (rank 0 writes, every rank waits for it; under FSDP
        every rank writes its shards)."""
        path = location(path)
        state = self.checkpoint_state(save_optimizer)
        if self.sharded_checkpoints:
            return run_state.write(self, state, path)
        error = None
        if self.is_main:
            try:
                ckpt_io.write(state, path)
            except CheckpointError as exc:
                error = exc
        if collectives.any_rank(error is not None) and error is None:  # every rank waits, all fail
            error = CheckpointError(f"rank 0 could not write checkpoint {path}")
        if error is not None:
            raise error
        return path

    @property
    def _local_checkpoint_dir(self) -> Path | None:
        """The checkpoint folder for trackers that upload from it: local folders only."""
        return self.checkpoint_dir if isinstance(self.checkpoint_dir, Path) else None

    def load_checkpoint(self, path: str | Path | URL, resume: bool = True) -> dict[str, Any]:
        """Load weights (``resume=False``) or the whole training state (``resume=True``)."""
        return run_resume.load_into(self, location(path), resume)

    # -- loops ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _run(self, mode: str) -> Any:
        """Open writers, set the mode, report exceptions to ``on_exception``, close writers."""
        outer = self._depth == 0
        self._depth += 1
        previous, self.mode = self.mode, mode
        if outer and self.is_main and not self.writers:
            # the states of this Runner's previous pass: a test pass continues the tracker run
            states = getattr(self, "_writer_states", {})
            self.writers = open_writers(
                self._writer_classes, self.work_dir, states, self._local_checkpoint_dir
            )
            config = {**self.config, "active_plugins": self._plugin_rows()}
            for writer in self.writers:
                writer.write_config(config)
        failure: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            failure = exc
            if outer:
                self._on_exception(exc)
            raise
        finally:
            self._depth -= 1
            self.mode = previous
            if outer:
                status = run_status(failure, self.stop_signals.agreed is not None)
                writers, self.writers = self.writers, []
                self._writer_states = close_writers(writers, status)

    def _on_exception(self, exc: BaseException) -> None:
        self.hooks.on_exception(runner=self, exception=exc)

    def _plugin_rows(self) -> list[dict[str, Any]]:
        """Active plugins and hooks in call order with priority and settings (for writers)."""
        rows = []
        for name, obj in self.manager.ordered:
            row: dict[str, Any] = {"name": name, "priority": self.manager.priorities[name]}
            settings = getattr(obj, "settings", None)
            if hasattr(settings, "model_dump"):
                row["settings"] = settings.model_dump(mode="json")  # type: ignore[union-attr]
            rows.append(row)
        return rows

    def _evaluate_alone(self, mode: str) -> dict[str, float]:
        loader = self._loaders[mode]
        if loader is None:
            raise ConfigError(f"runner.{mode}: no {mode}_dataloader was given")
        with self._run(mode):
            self.hooks.before_run(runner=self)
            metrics = evaluate(self, loader, mode, hooks=True)
            self.hooks.after_run(runner=self)
        return metrics


if TYPE_CHECKING:

    def _offers_the_plugin_surface(runner: Runner) -> RunnerProtocol:
        """mypy checks here that the Runner is everything plugins are promised."""
        return runner

    def _offers_what_checkpoints_need(runner: Runner) -> Checkpointable:
        """mypy checks here that the Runner is what the checkpoint code works on."""
        return runner

"""The backward and optimizer updates of a training step: AMP scaling, accumulation, DDP's
``no_sync``, clipping, and the four hook points around them (docs/hooks.md).

Kept apart from the loop the way MMEngine splits ``OptimWrapper`` from its loops: the loop
decides *when* (the position's ``closes_group``), this object *how*, and counts each step
in the position's ``optimizer_steps``. In manual optimization it is the ``optim`` a
``training_step(batch, optim)`` receives (docs/training-step.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from hookrun.distributed import fsdp
from hookrun.distributed.collectives import all_reduce_sum
from hookrun.engine.scalars import ScalarStore
from hookrun.engine.steps import StepError
from hookrun.errors import ConfigError
from hookrun.hooks.dispatch import Hooks

SINGLE = "main"
"""The name of the one optimizer of a run given a single optimizer."""


def named_optimizers(optimizer: Any, scheduler: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The optimizers and schedulers by name: a single object is named ``"main"``. Refuses
    scheduler names that are no optimizer's and a parameter two optimizers train."""
    optimizers = _named(optimizer)
    schedulers = _named(scheduler)
    if isinstance(scheduler, Mapping) and not isinstance(optimizer, Mapping) and optimizer:
        raise ConfigError(
            "scheduler: a mapping of names needs optimizer= as a mapping with the same names"
        )
    unknown = [name for name in schedulers if name not in optimizers]
    if unknown:
        raise ConfigError(
            f"scheduler: {', '.join(map(repr, unknown))} names no optimizer; the optimizers "
            f"are {', '.join(map(repr, optimizers))}"
        )
    owner: dict[int, str] = {}
    for name, opt in optimizers.items():
        for group in opt.param_groups:
            for param in group["params"]:
                other = owner.setdefault(id(param), name)
                if other != name:
                    raise ConfigError(
                        f"optimizer: {other!r} and {name!r} both train a parameter of shape "
                        f"{list(param.shape)}; give each optimizer its own parameters"
                    )
    return optimizers, schedulers


def _named(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(name): item for name, item in value.items() if item is not None}
    return {SINGLE: value}


class OptimizerStep:
    """Backward, then each optimizer's step: unscale, ``before_optimizer_step`` (any
    ``False`` skips the step), clip, step, ``after_optimizer_step``, zero its gradients and
    step its per-iteration scheduler. Automatic optimization steps every optimizer at an
    accumulation boundary; manual optimization calls :meth:`step` by name."""

    def __init__(
        self,
        runner: Any,
        hooks: Hooks,
        scalars: ScalarStore,
        grad_accum: int,
        clip_grad: Mapping[str, Any] | None,
        scaler: torch.amp.GradScaler | None,
        normalize: str = "batches",
    ) -> None:
        self.runner = runner
        self.optimizers: dict[str, torch.optim.Optimizer] = runner.optimizers
        """The run's optimizers by name (``"main"`` when there is one)."""
        self.hooks = hooks
        self.scalars = scalars
        self.grad_accum = grad_accum
        self.clip_grad = dict(clip_grad) if clip_grad else None
        self.scaler = scaler
        self.by_items = normalize == "items"
        self.items: torch.Tensor | int = 0  # the accumulation group's items so far
        self.sharded = runner.strategy == "fsdp"
        self.clip = fsdp.clip_grad_norm_ if self.sharded else nn.utils.clip_grad_norm_
        # the hook points nothing implements are skipped: the plain step pays for none of them
        self.around_backward = hooks.before_backward.used or hooks.after_backward.used
        self.before_step = hooks.before_optimizer_step.used
        self.after_step = hooks.after_optimizer_step.used
        self.stepped = False  # whether an optimizer stepped in this iteration (GradScaler)

    def simple(self) -> bool:
        """Whether a step is only ``backward``, then each optimizer's ``step`` and
        ``zero_grad``: fp32, every batch a step, no clipping, no per-iteration scheduler and
        nothing implementing the four hook points."""
        return (
            self.scaler is None
            and self.grad_accum == 1
            and not self.by_items
            and not self.clip_grad
            and not (self.around_backward or self.before_step or self.after_step)
            and not self.steps_scheduler()
        )

    def steps_scheduler(self) -> bool:
        """Whether a scheduler steps after its optimizer's steps (``scheduler_interval: iter``)."""
        runner = self.runner
        return bool(runner.schedulers) and runner.scheduler_interval == "iter"

    def sync_context(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` (FSDP2's ``set_requires_gradient_sync(False)``) inside an
        accumulation group: gradients are reduced once, at the boundary."""
        model = self.runner.model
        if self.sharded:
            model.set_requires_gradient_sync(boundary)
            return contextlib.nullcontext()
        if boundary or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()

    def backward(self, loss: torch.Tensor, items: Any = None) -> None:
        """Back-propagate ``loss`` (AMP-scaled). Automatic optimization divides it by
        ``grad_accum``; with ``grad_accum_normalize: items`` it is weighted by the ``items``
        it averages over, and the group's gradients are divided by the group's items at the
        step, so the group's loss is its summed loss over its items."""
        runner, hooks = self.runner, self.hooks
        if self.by_items:
            if items is None:
                raise StepError(
                    "runner.grad_accum_normalize: items divides by the items the steps report, "
                    "and this step's outputs hold no num_items; return {'loss': ..., "
                    "'num_items': ...} from training_step, or use grad_accum_normalize: batches"
                )
            loss = loss * items
            self.items = self.items + items
        elif self.grad_accum > 1:
            loss = loss / self.grad_accum
        if self.around_backward:
            hooks.before_backward(runner=runner, loss=loss)
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        if torch.is_autocast_enabled():  # a manual step's backward, inside the forward's autocast
            with torch.autocast(runner.device.type, enabled=False):
                scaled.backward()
        else:
            scaled.backward()
        if self.around_backward:
            hooks.after_backward(runner=runner)

    def step(self, name: str | None = None) -> None:
        """Step the optimizer ``name``; every optimizer, in order, when ``name`` is None (the
        automatic step at an accumulation boundary, which also updates AMP's scale)."""
        if name is None:
            if self.by_items:
                self._divide_by_items()
            for each in self.optimizers:
                self._step_one(each)
            self.end_iteration()
            return
        if name not in self.optimizers:
            raise ConfigError(
                f"optim.step: no optimizer named {name!r}; the optimizers are "
                f"{', '.join(map(repr, self.optimizers))}"
            )
        if self.runner.world_size > 1:
            average_gradients(optimizer_params(self.optimizers[name]))
        self._step_one(name)

    def end_iteration(self) -> None:
        """After an iteration's steps: update AMP's scale once, as PyTorch documents for
        several optimizers."""
        if self.scaler is not None and self.stepped:
            self.scaler.update()
        self.stepped = False

    def _step_one(self, name: str) -> None:
        runner, hooks, scaler = self.runner, self.hooks, self.scaler
        optimizer = self.optimizers[name]
        if scaler is not None:
            scaler.unscale_(optimizer)
        stepped = True
        if self.before_step:
            verdicts = hooks.before_optimizer_step(
                runner=runner, optimizer=optimizer, optimizer_name=name
            )
            stepped = False not in verdicts
        if stepped:
            if self.clip_grad:
                self._clip(name, optimizer)
            if scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        steps = runner.position.optimizer_steps
        steps[name] = steps.get(name, 0) + 1  # vetoed or skipped by GradScaler: still a step
        self.stepped = True
        if stepped and self.after_step:
            hooks.after_optimizer_step(runner=runner, optimizer=optimizer, optimizer_name=name)
        optimizer.zero_grad(set_to_none=True)
        scheduler = runner.schedulers.get(name)
        if scheduler is not None and runner.scheduler_interval == "iter":
            scheduler.step()

    def _clip(self, name: str, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients ``optimizer`` steps with; the norm goes to ``train/grad_norm``
        (``train/grad_norm/<name>`` with several optimizers)."""
        several = len(self.optimizers) > 1
        params = (
            optimizer_params(optimizer) if several else self.runner.unwrapped_model.parameters()
        )
        norm = self.clip(params, **self.clip_grad)  # type: ignore[arg-type]
        self.scalars.put(f"train/grad_norm/{name}" if several else "train/grad_norm", norm)

    def _divide_by_items(self) -> None:
        """Divide the group's gradients by its items, every rank's (DDP averaged the
        gradients over the ranks, so they are scaled back by the number of ranks)."""
        items = torch.as_tensor(self.items, dtype=torch.float64)
        world = self.runner.world_size
        if world > 1:
            items = all_reduce_sum(items.to(self.runner.device)).cpu()
        self.items = 0
        factor = world / max(float(items), 1.0)
        params = [p for opt in self.optimizers.values() for p in optimizer_params(opt)]
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, factor)


def optimizer_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every parameter ``optimizer`` steps, group by group."""
    for group in optimizer.param_groups:
        yield from group["params"]


def average_gradients(params: Iterator[torch.Tensor]) -> None:
    """Each gradient summed over the ranks and divided by their number, as DDP does, where
    DDP's hooks do not run: a manual step outside DDP's forward, a stream's last group, an
    epoch's joined last iteration."""
    world = torch_dist.get_world_size()
    grads = [p.grad for p in params if p.grad is not None]
    by_type: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for grad in grads:
        by_type.setdefault((grad.device, grad.dtype), []).append(grad)
    for group in by_type.values():
        flat = torch.cat([g.reshape(-1) for g in group])
        torch_dist.all_reduce(flat)
        flat.div_(world)
        for grad, part in zip(group, flat.split([g.numel() for g in group]), strict=True):
            grad.copy_(part.view_as(grad))


class TailJoin(Joinable):
    """The gradient all-reduce of an epoch's last iteration when some rank's share has no
    batch for it (DDP, unpadded shares: :mod:`hookrun.data.sharding`), under
    :class:`~torch.distributed.algorithms.Join`. A rank with a batch averages after its
    backward (:meth:`average`); a rank without one joins, and its join hook shadows that
    all-reduce with the gradients it holds (none: zero) and receives the same average. So
    every rank then takes the same optimizer step: DDP's own join hook would leave a joined
    rank's optimizer state, schedule and plugins a step behind. The iteration bypasses the
    DDP wrapper, whose forward a joined rank could not match."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.device = device

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _Shadow(self)

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return torch_dist.group.WORLD

    def average(self) -> None:
        """After this rank's backward: the gradients averaged over every rank."""
        Join.notify_join_context(self)
        self.all_reduce()

    def all_reduce(self) -> None:
        """Each gradient summed over the ranks and divided by their number, as DDP does; a
        parameter no rank has a gradient for keeps none (the optimizer skips it)."""
        params = self.params
        held = torch.tensor([p.grad is not None for p in params], device=self.device).float()
        torch_dist.all_reduce(held)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        average_gradients(iter(params))
        for p, count in zip(params, held.tolist(), strict=True):
            if not count:
                p.grad = None


class _Shadow(JoinHook):
    """A joined rank's part in :class:`TailJoin`'s all-reduce."""

    def __init__(self, tail: TailJoin) -> None:
        self.tail = tail

    def main_hook(self) -> None:
        self.tail.all_reduce()

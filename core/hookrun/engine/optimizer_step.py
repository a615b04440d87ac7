"""One training step's backward and optimizer update: AMP scaling, accumulation, DDP's
``no_sync``, clipping, and the four hook points around them (docs/hooks.md).

Kept apart from the loop the way MMEngine splits ``OptimWrapper`` from its loops: the loop
decides *when* (the position's ``closes_group``), this object *how*, and counts each step
in the position's ``optimizer_steps``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from hookrun.distributed import fsdp
from hookrun.engine.scalars import ScalarStore
from hookrun.hooks.dispatch import Hooks


class OptimizerStep:
    """Backward, then at an accumulation boundary: unscale, ``before_optimizer_step`` (any
    ``False`` skips the step), clip, step, ``after_optimizer_step``, zero the gradients and
    step a per-iteration scheduler."""

    def __init__(
        self,
        runner: Any,
        hooks: Hooks,
        scalars: ScalarStore,
        grad_accum: int,
        clip_grad: Mapping[str, Any] | None,
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self.runner = runner
        self.hooks = hooks
        self.scalars = scalars
        self.grad_accum = grad_accum
        self.clip_grad = dict(clip_grad) if clip_grad else None
        self.scaler = scaler
        self.sharded = runner.strategy == "fsdp"
        self.clip = fsdp.clip_grad_norm_ if self.sharded else nn.utils.clip_grad_norm_
        # the hook points nothing implements are skipped: the plain step pays for none of them
        self.around_backward = hooks.before_backward.used or hooks.after_backward.used
        self.before_step = hooks.before_optimizer_step.used
        self.after_step = hooks.after_optimizer_step.used

    def simple(self) -> bool:
        """Whether a step is only ``backward``, ``step`` and ``zero_grad``: fp32, every batch
        a step, no clipping, no per-iteration scheduler and nothing implementing the four
        hook points."""
        return (
            self.scaler is None
            and self.grad_accum == 1
            and not self.clip_grad
            and not (self.around_backward or self.before_step or self.after_step)
            and not self.steps_scheduler()
        )

    def steps_scheduler(self) -> bool:
        """Whether the scheduler steps after every optimizer step (``scheduler_interval: iter``)."""
        runner = self.runner
        return runner.scheduler is not None and runner.scheduler_interval == "iter"

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

    def backward(self, loss: torch.Tensor) -> None:
        runner, hooks = self.runner, self.hooks
        if self.grad_accum > 1:
            loss = loss / self.grad_accum
        if self.around_backward:
            hooks.before_backward(runner=runner, loss=loss)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.around_backward:
            hooks.after_backward(runner=runner)

    def step(self) -> None:
        """The update at an accumulation boundary."""
        runner, hooks, scaler = self.runner, self.hooks, self.scaler
        optimizer = runner.optimizer
        if scaler is not None:
            scaler.unscale_(optimizer)
        stepped = True
        if self.before_step:
            verdicts = hooks.before_optimizer_step(runner=runner, optimizer=optimizer)
            stepped = False not in verdicts
        if stepped:
            if self.clip_grad:
                norm = self.clip(runner.unwrapped_model.parameters(), **self.clip_grad)
                self.scalars.put("train/grad_norm", norm)
            if scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        runner.position.optimizer_steps += 1  # vetoed or skipped by GradScaler: still a step
        if stepped and self.after_step:
            hooks.after_optimizer_step(runner=runner, optimizer=optimizer)
        if scaler is not None:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if self.steps_scheduler():
            runner.scheduler.step()


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
        params, world = self.params, torch_dist.get_world_size()
        held = torch.tensor([p.grad is not None for p in params], device=self.device).float()
        torch_dist.all_reduce(held)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_type: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = {}
        for p in params:
            by_type.setdefault((p.grad.device, p.grad.dtype), []).append(p)  # type: ignore[union-attr]
        for group in by_type.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])  # type: ignore[union-attr]
            torch_dist.all_reduce(flat)
            flat.div_(world)
            for p, part in zip(group, flat.split([p.numel() for p in group]), strict=True):
                p.grad.copy_(part.view_as(p))  # type: ignore[union-attr]
        for p, count in zip(params, held.tolist(), strict=True):
            if not count:
                p.grad = None


class _Shadow(JoinHook):
    """A joined rank's part in :class:`TailJoin`'s all-reduce."""

    def __init__(self, tail: TailJoin) -> None:
        self.tail = tail

    def main_hook(self) -> None:
        self.tail.all_reduce()

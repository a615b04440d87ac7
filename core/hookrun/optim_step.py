"""One training step's backward and optimizer update: AMP scaling, accumulation, DDP's
``no_sync``, clipping, and the four hook points around them (DESIGN §3).

Kept apart from the loop the way MMEngine splits ``OptimWrapper`` from its loops: the loop
decides *when* (which batch closes an accumulation group), this object *how*.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookrun import fsdp
from hookrun.dispatch import Hooks
from hookrun.scalars import ScalarStore


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
            if self.after_step:
                hooks.after_optimizer_step(runner=runner, optimizer=optimizer)
        if scaler is not None:
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if self.steps_scheduler():
            runner.scheduler.step()

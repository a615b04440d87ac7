"""One training iteration: forward, backward and the optimizer steps, then the position
advanced and the losses stored. The loop around it is :mod:`hookrun.engine.train_loop`'s; the
optimizer step (AMP, accumulation, clipping) is
:class:`~hookrun.engine.optimizer_step.OptimizerStep`'s; what a batch means is
:mod:`hookrun.engine.steps`'.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.distributed.algorithms.join import Join

from hookrun.engine.optimizer_step import TailJoin, average_gradients, optimizer_params
from hookrun.engine.steps import step_outputs, training_losses


class TrainStep:
    """One iteration: forward (the model's convention), backward and, at an accumulation
    boundary, the optimizer steps, or the model's own ``training_step(batch, optim)``; then
    the position advances and the losses are stored. ``take(batch, batch_idx)`` runs it and
    returns the detached losses for ``after_train_iter`` (None when no hook reads them)."""

    def __init__(self, runner: Any, per_epoch: int | None) -> None:
        self.runner = runner
        self.per_epoch = per_epoch
        self.optim = optim = runner.optimizer_step
        self.plain = runner.amp is None and runner.world_size == 1  # no context managers
        self.model, self.module = runner.model, runner.unwrapped_model
        self.criterion = runner.criterion
        self.step = getattr(runner.unwrapped_model, "training_step", None)
        self.manual = runner.manual
        self.optimizers = tuple(optim.optimizers.items())
        self.position = runner.position
        self.put = runner.scalars.put
        self.put_loss = runner.scalars.appender("train/loss")  # a C call per iteration
        self.where = f"{type(self.module).__name__}.training_step"
        self.hooked = runner.hooks.after_train_iter.used  # something reads the losses
        self.uneven = False  # some rank has no batch for the epoch's last iteration
        # The common case takes its step in one frame: each Python frame costs about a
        # microsecond between torch ops, a few percent of a small model's step.
        simple = self.plain and optim.simple() and not self.manual
        self.take = self.simple_step if simple else self.any_step
        # The last loss, graph included, lives until the next one replaces it, as a hand
        # loop's ``loss`` variable does: the parameters' gradient accumulators (the graph's
        # leaves) are then reused by the next forward instead of being rebuilt.
        self.last_loss: torch.Tensor | None = None

    def simple_step(self, batch: Any, batch_idx: int) -> dict[str, Any] | None:
        """fp32, every batch a step, nothing around the steps (:meth:`OptimizerStep.simple`):
        its backward, then each optimizer's step and ``zero_grad``, inline."""
        losses = training_losses(self.model, self.module, self.step, self.criterion, batch)
        loss = self.last_loss = losses["loss"]
        loss.backward()
        pos = self.position
        steps = pos.optimizer_steps
        pos.stepping = True
        for name, optimizer in self.optimizers:
            optimizer.step()
            steps[name] = steps.get(name, 0) + 1
            optimizer.zero_grad(set_to_none=True)
        pos.iteration_done(batch_idx + 1)
        if len(losses) > 1:
            return self.stored(losses)
        loss = loss.detach()  # what the store keeps: a graph-free tensor, not read until a report
        self.put_loss(loss)
        return {"loss": loss} if self.hooked else None

    def any_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Any other step: manual optimization, AMP, accumulation, DDP or FSDP, clipping,
        hooks around the optimizer step, an epoch's last iteration that some rank joins
        without a batch."""
        runner, pos = self.runner, self.position
        if self.manual:
            losses = self.manual_step(batch)
        elif self.uneven and batch_idx + 1 == self.per_epoch:
            losses = self.joined(batch)
        else:
            optim = self.optim
            boundary = pos.closes_group
            if self.plain:
                losses = training_losses(self.model, self.module, self.step, self.criterion, batch)
                optim.backward(losses["loss"], losses.get("num_items"))
            else:
                with optim.sync_context(boundary):
                    with runner.autocast():
                        losses = training_losses(
                            self.model, self.module, self.step, self.criterion, batch
                        )
                    optim.backward(losses["loss"], losses.get("num_items"))
            if boundary:
                pos.stepping = True
                optim.step()
        pos.iteration_done(batch_idx + 1)
        return self.stored(losses)

    def stored(self, losses: dict[str, Any]) -> dict[str, Any]:
        """The losses detached (numbers as they are), each put in the scalar store as
        ``train/<name>``; empty for a rank that joined the iteration without a batch."""
        outputs = {}
        for name, value in losses.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
            outputs[name] = value
            self.put("train/" + name, value)
        return outputs

    def close_group(self) -> None:
        """Step a stream's last, short accumulation group once its iterator ended (its last
        batch was not known as such); under DDP its gradients, accumulated without DDP's
        reduction, are averaged over the ranks first, as DDP would have at a boundary."""
        runner, pos = self.runner, self.runner.position
        if runner.world_size > 1:
            for optimizer in self.optim.optimizers.values():
                average_gradients(optimizer_params(optimizer))
        pos.stepping = True
        self.optim.step()
        pos.stepping = False
        pos.closes_group = True

    def manual_step(self, batch: Any) -> dict[str, Any]:
        """The model's ``training_step(batch, optim)``: it calls ``optim.backward`` and
        ``optim.step(name)``. Every gradient is cleared afterwards, so none is left to the
        next iteration (or a checkpoint) by a loss that reached another model's weights."""
        runner, optim = self.runner, self.optim
        runner.position.stepping = True
        with runner.autocast():
            out = self.step(batch, optim)  # type: ignore[misc]
        optim.end_iteration()
        for _, optimizer in self.optimizers:
            clear_gradients(optimizer)
        return step_outputs(out, self.where, required=False)

    def joined(self, batch: Any) -> dict[str, torch.Tensor]:
        """The epoch's last iteration when some rank's share has none (``batch`` is None on
        such a rank): the ranks with a batch run it on the unwrapped model, every rank's
        gradients are averaged under :class:`~hookrun.engine.optimizer_step.TailJoin`, and
        every rank steps alike. Returns this rank's losses (none without a batch)."""
        runner, optim = self.runner, self.optim
        module = runner.unwrapped_model
        losses: dict[str, torch.Tensor] = {}
        with warnings.catch_warnings():  # Join's exit sets a process-wide warnings filter
            tail = TailJoin(module, runner.device)
            with Join([tail]):
                if batch is not None:
                    with runner.autocast():
                        losses = training_losses(module, module, self.step, runner.criterion, batch)
                    optim.backward(losses["loss"], losses.get("num_items"))
                    tail.average()
        runner.position.stepping = True
        optim.step()
        return losses


def clear_gradients(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` without its profiler range and checks, which
    cost a few microseconds each time; an optimizer with its own ``zero_grad`` is asked."""
    if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad:
        optimizer.zero_grad(set_to_none=True)
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None

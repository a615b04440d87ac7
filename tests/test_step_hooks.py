"""The four step hook points under gradient accumulation (docs/hooks.md): where they fire within
an epoch, and what a ``before_optimizer_step`` returning ``False`` leaves behind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from hookrun import Runner, hookimpl
from hookrun.testing import toy_data, toy_runner_kwargs


def accumulating_run(tmp_path: Path, hook: object) -> Runner:
    """2 epochs of 5 batches with ``grad_accum=2``."""
    kwargs = toy_runner_kwargs(
        tmp_path, train_dataloader=toy_data(10, 2), grad_accum=2, device="cpu", hooks=[hook]
    )
    return Runner(**kwargs)


class Recorder:
    """Iteration-level hook calls as (hook, epoch, inner_iter); ``batch_idx``, where a hook
    gets one, must be ``inner_iter``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def note(self, hook: str, runner: Any) -> None:
        self.calls.append((hook, runner.epoch, runner.inner_iter))

    @hookimpl
    def before_train_iter(self, runner: Any, batch_idx: int) -> None:
        assert batch_idx == runner.inner_iter
        self.note("before_train_iter", runner)

    @hookimpl
    def before_backward(self, runner: Any) -> None:
        self.note("before_backward", runner)

    @hookimpl
    def after_backward(self, runner: Any) -> None:
        self.note("after_backward", runner)

    @hookimpl
    def before_optimizer_step(self, runner: Any) -> None:
        self.note("before_optimizer_step", runner)

    @hookimpl
    def after_optimizer_step(self, runner: Any) -> None:
        self.note("after_optimizer_step", runner)

    @hookimpl
    def after_train_iter(self, runner: Any, batch_idx: int) -> None:
        assert batch_idx == runner.inner_iter
        self.note("after_train_iter", runner)


def test_steps_close_every_second_batch_and_each_epoch(tmp_path: Path) -> None:
    """Batches 1 and 3 close a group of two, batch 4 (the epoch's last) a group of one:
    3 steps per epoch; backward hooks fire every batch, all in docs/hooks.md's order."""
    rec = Recorder()
    accumulating_run(tmp_path, rec).train()
    expected = []
    for epoch in range(2):
        for batch in range(5):
            step = ["before_optimizer_step", "after_optimizer_step"] if batch in (1, 3, 4) else []
            hooks = ["before_train_iter", "before_backward", "after_backward", *step]
            expected += [(hook, epoch, batch) for hook in [*hooks, "after_train_iter"]]
    assert rec.calls == expected


class SkipOneStep:
    """Refuses the optimizer step that closes batch ``at`` (a global iteration index) and
    records what the runner does about it."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.before: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}
        self.had_grads = False
        self.grads_next_iter: list[torch.Tensor | None] | None = None
        self.stepped_at: list[int] = []

    @hookimpl
    def before_optimizer_step(self, runner: Any) -> bool | None:
        if runner.iter != self.at:
            return None
        model = runner.unwrapped_model
        self.had_grads = all(p.grad is not None for p in model.parameters())
        self.before = copy.deepcopy(model.state_dict())
        return False

    @hookimpl
    def after_optimizer_step(self, runner: Any) -> None:
        self.stepped_at.append(runner.iter)

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            self.after = copy.deepcopy(runner.unwrapped_model.state_dict())

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at + 1:
            self.grads_next_iter = [p.grad for p in runner.unwrapped_model.parameters()]


def test_a_refused_step_changes_nothing_and_drops_the_gradients(tmp_path: Path) -> None:
    skip = SkipOneStep(at=3)  # the second step of epoch 0
    accumulating_run(tmp_path, skip).train()
    assert skip.had_grads
    assert skip.before.keys() == skip.after.keys()
    for key, value in skip.before.items():
        assert torch.equal(value, skip.after[key]), key
    assert skip.grads_next_iter is not None
    assert all(grad is None for grad in skip.grads_next_iter)
    assert skip.stepped_at == [1, 4, 6, 8, 9]  # every step but the refused one

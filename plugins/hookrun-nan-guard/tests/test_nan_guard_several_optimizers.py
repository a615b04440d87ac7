"""The guard with several optimizers (docs/plugins/nan_guard.md): each optimizer's step is
checked on its own gradients, a bad one is skipped alone (the other optimizer steps), and
the message names the optimizer and its first non-finite gradient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookrun import Runner, hookimpl
from hookrun.testing import toy_data


class PoisonHead:
    """Puts a NaN into the head's gradient before its step at iteration 2 (runs first);
    keeps the weights that iteration started from."""

    priority = 0

    def __init__(self, model: nn.Sequential) -> None:
        self.model = model
        self.before: dict[str, torch.Tensor] = {}

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == 2:
            self.before = {k: v.clone() for k, v in self.model.state_dict().items()}

    @hookimpl
    def before_optimizer_step(self, runner: Any, optimizer_name: str) -> None:
        if runner.iter == 2 and optimizer_name == "head":
            self.model[1].weight.grad[0, 0] = float("nan")


class AfterIteration2:
    """The weights once iteration 2's steps are done."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.weights = model, {}

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == 2:
            self.weights = {k: v.clone() for k, v in self.model.state_dict().items()}


def run(tmp_path: Path, action: str) -> tuple[Runner, PoisonHead, AfterIteration2]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    poison, after = PoisonHead(model), AfterIteration2(model)
    runner = Runner(
        model=model,
        train_dataloader=toy_data(16, 4),
        optimizer={
            "body": torch.optim.SGD(model[0].parameters(), lr=0.1),
            "head": torch.optim.SGD(model[1].parameters(), lr=0.1),
        },
        criterion=nn.CrossEntropyLoss(),
        max_iters=4,
        work_dir=tmp_path / "run",
        writers=(),
        plugins={"nan_guard": {"action": action}},
        hooks=[poison, after],
    )
    return runner, poison, after


def test_a_bad_step_of_one_optimizer_is_skipped_and_the_other_steps(tmp_path: Path) -> None:
    runner, poison, after = run(tmp_path, "skip")
    runner.train()
    assert runner.plugins["nan_guard"].skipped == 1
    assert torch.equal(after.weights["1.weight"], poison.before["1.weight"])  # head: skipped
    assert not torch.equal(after.weights["0.weight"], poison.before["0.weight"])  # body: stepped
    assert runner.position.optimizer_steps == {"body": 4, "head": 4}
    assert all(bool(torch.isfinite(p).all()) for p in runner.unwrapped_model.parameters())


def test_the_failure_names_the_optimizer_and_its_gradient(tmp_path: Path) -> None:
    runner = run(tmp_path, "raise")[0]
    with pytest.raises(RuntimeError) as info:
        runner.train()
    assert str(info.value) == (
        "nan_guard: non-finite step of optimizer 'head' at iteration 2 (1 in a row): "
        "not finite: grad of 1.weight"
    )

"""The EMA in a run with several optimizers (docs/plugins/ema.md): it follows the optimizer
its ``optimizer`` setting names — one update per step of that optimizer, in automatic and in
manual optimization — averages that optimizer's parameters and copies the others; without
the setting, or with a name the run lacks, it is one line before training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookrun import ConfigError, Runner, hookimpl
from hookrun.testing import toy_data

DECAY = 0.8


class TwoParts(nn.Module):
    """A body and a head; ``manual``: ``training_step`` steps the body every iteration and
    the head every second one (a GAN's generator stepped less often than its critic)."""

    def __init__(self, manual: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)
        self.calls = 0
        if manual:
            self.training_step = self.manual_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))

    def manual_step(self, batch: Any, optim: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        optim.backward(loss)
        optim.step("body")
        self.calls += 1
        if self.calls % 2 == 0:
            loss = nn.functional.cross_entropy(self(x), y)
            optim.backward(loss)
            optim.step("head")
        return {"loss": loss.detach()}


class HeadSteps:
    """The head's weights after each of its steps, as the EMA sees them (it runs first)."""

    def __init__(self, model: TwoParts) -> None:
        self.model, self.seen = model, []

    @hookimpl
    def after_optimizer_step(self, optimizer_name: str) -> None:
        if optimizer_name == "head":
            self.seen.append(
                {k: v.detach().clone() for k, v in self.model.head.state_dict().items()}
            )


def run(tmp_path: Path, manual: bool, ema: dict[str, Any]) -> tuple[Runner, TwoParts, HeadSteps]:
    model = TwoParts(manual)
    steps = HeadSteps(model)
    runner = Runner(
        model=model,
        train_dataloader=toy_data(24, 4),
        optimizer={
            "body": torch.optim.SGD(model.body.parameters(), lr=0.1),
            "head": torch.optim.SGD(model.head.parameters(), lr=0.1),
        },
        criterion=None if manual else nn.CrossEntropyLoss(),
        max_epochs=2,
        work_dir=tmp_path / "run",
        writers=(),
        plugins={"ema": ema},
        hooks=[steps],
    )
    runner.train()
    return runner, model, steps


def by_hand(start: dict[str, torch.Tensor], seen: list[dict[str, torch.Tensor]]) -> dict:
    """The average of ``seen``, one update each, with the plugin's warm-up formula."""
    ema = {k: v.clone() for k, v in start.items()}
    for t, weights in enumerate(seen):
        decay = min(DECAY, (1 + t) / (10 + t))
        ema = {k: decay * ema[k] + (1 - decay) * weights[k] for k in ema}
    return ema


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_the_average_follows_the_named_optimizers_steps_and_parameters(
    tmp_path: Path, manual: bool
) -> None:
    start = {k: v.detach().clone() for k, v in TwoParts(manual).head.state_dict().items()}
    runner, model, steps = run(tmp_path, manual, {"decay": DECAY, "optimizer": "head"})
    state = runner.plugins["ema"].state_dict()
    # 6 iterations an epoch: the head steps at every one, or at every second one
    assert len(steps.seen) == (12 if not manual else 6)
    assert state["updates"] == state["steps"] == len(steps.seen)
    assert runner.position.optimizer_steps == {"body": 12, "head": len(steps.seen)}
    expected = by_hand(start, steps.seen)
    for key, value in expected.items():
        torch.testing.assert_close(state["model"][f"head.{key}"], value, rtol=1e-6, atol=1e-7)
    for key, value in model.body.state_dict().items():  # not averaged: the trained weights
        assert torch.equal(state["model"][f"body.{key}"], value), key


@pytest.mark.parametrize(
    ("ema", "line"),
    [
        (
            {},
            "plugins.ema.optimizer: this run has several optimizers ('body', 'head'); name the "
            "one whose steps the average follows",
        ),
        (
            {"optimizer": "generator"},
            "plugins.ema.optimizer: 'generator' is not an optimizer of this run ('body', 'head')",
        ),
    ],
)
def test_a_missing_or_unknown_optimizer_is_one_line_before_training(
    tmp_path: Path, ema: dict[str, Any], line: str
) -> None:
    with pytest.raises(ConfigError) as info:
        run(tmp_path, False, ema)
    assert info.value.lines == [line]
    assert not (tmp_path / "run" / "checkpoints").exists()

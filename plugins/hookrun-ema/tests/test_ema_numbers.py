"""The average the plugin keeps equals the plain formula computed apart in float64."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ema_testing import Recorder, bn_mlp, loader, reference, relative_error
from torch import nn

from hookrun import Runner


def train(model: nn.Module, ema: dict, tmp_path, iters: int = 40, **kwargs: Any) -> tuple:
    recorder = Recorder()
    runner = Runner(
        model,
        train_dataloader=loader(96, seed=0, shuffle=True),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        max_iters=iters,
        work_dir=tmp_path,
        writers=(),
        device="cpu",
        plugins={"ema": ema},
        hooks=[recorder],
        **kwargs,
    )
    runner.train()
    return runner, recorder


CASES = {
    "warmup": {"decay": 0.95},
    "no-warmup": {"decay": 0.9, "warmup": False},
    "interval-3": {"decay": 0.9, "update_interval": 3},
    "start-iter-7": {"decay": 0.9, "warmup": False, "start_iter": 7},
    "interval-and-start": {"decay": 0.8, "update_interval": 2, "start_iter": 5},
    "average-buffers": {"decay": 0.9, "buffers": "average"},
}


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_average_equals_float64_formula(settings: dict, tmp_path) -> None:
    model = bn_mlp()
    runner, rec = train(model, settings, tmp_path)
    averaged = {k for k, _ in model.named_parameters()}
    if settings.get("buffers") == "average":
        averaged |= {k for k, b in model.named_buffers() if b.is_floating_point()}
    options = {k: v for k, v in settings.items() if k != "buffers"}
    want = reference(rec, averaged, **options)
    got = runner.plugins["ema"].state_dict()["model"]
    assert list(got) == list(model.state_dict())
    for key, value in want.items():
        assert relative_error(got[key], value) <= 1e-6, key
    # the average is neither the trained weights nor the initial ones
    final, start = rec.steps[-1], rec.initial
    assert relative_error(got["0.weight"], final["0.weight"]) > 1e-3
    assert relative_error(got["0.weight"], start["0.weight"]) > 1e-3


def test_amp_bf16_keeps_fp32_weights_and_averages_them(tmp_path) -> None:
    model = bn_mlp()
    runner, rec = train(model, {"decay": 0.9}, tmp_path, iters=20, amp="bf16")
    want = reference(rec, {k for k, _ in model.named_parameters()}, 0.9)
    got = runner.plugins["ema"].state_dict()["model"]
    for key, value in want.items():
        assert relative_error(got[key], value) <= 1e-6, key


class Assign(torch.optim.Optimizer):
    """Sets every parameter to 1: the average of a constant is known in closed form."""

    def __init__(self, params) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.fill_(1.0)


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(16, dtype=torch.bfloat16))

    def training_step(self, batch: torch.Tensor) -> torch.Tensor:
        return (self.w.float() * batch).sum()


def test_bf16_model_reaches_the_expected_average(tmp_path) -> None:
    """At decay 0.9999, (1 - d) * (1 - ema) is below half a bf16 step of the average after a
    few updates, so a bf16 average would stall near 0.04; the float32 one reaches
    1 - 0.9999**2000 = 0.181."""
    model = Scalar()
    runner = Runner(
        model,
        train_dataloader=[torch.ones(16)] * 50,
        optimizer=Assign(model.parameters()),
        max_iters=2000,
        work_dir=tmp_path,
        writers=(),
        device="cpu",
        plugins={"ema": {"decay": 0.9999, "warmup": False}},
    )
    runner.train()
    state = runner.plugins["ema"].state_dict()
    expected = 1 - 0.9999**2000
    assert state["model"]["w"].dtype == torch.bfloat16
    assert state["shadow"]["w"].dtype == torch.float32
    assert torch.allclose(state["shadow"]["w"].double(), torch.tensor(expected).double(), rtol=0.01)
    assert torch.allclose(state["model"]["w"].double(), torch.tensor(expected).double(), rtol=0.01)
    assert state["updates"] == 2000

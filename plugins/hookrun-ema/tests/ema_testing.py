"""Models, data and the float64 reference shared by the EMA tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import hookimpl
from hookrun.testing import KillAt, SaveEvery


def bn_mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3), nn.BatchNorm1d(3)
    ).to(dtype)


def classification_data(n: int = 96, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x.to(dtype), y)


def loader(n: int, seed: int, shuffle: bool, dtype: torch.dtype = torch.float32) -> DataLoader:
    return DataLoader(classification_data(n, seed, dtype), batch_size=16, shuffle=shuffle)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(1) == targets).float()


class Recorder:
    """Every state-dict tensor in float64 at the start and after every iteration."""

    def __init__(self) -> None:
        self.initial: dict[str, torch.Tensor] = {}
        self.steps: list[dict[str, torch.Tensor]] = []

    @staticmethod
    def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().double().clone() for k, v in model.state_dict().items()}

    @hookimpl
    def before_train(self, runner) -> None:
        self.initial = self.snapshot(runner.unwrapped_model)

    @hookimpl
    def after_train_iter(self, runner) -> None:
        self.steps.append(self.snapshot(runner.unwrapped_model))


def reference(
    rec: Recorder,
    averaged: set[str],
    decay: float,
    warmup: bool = True,
    update_interval: int = 1,
    start_iter: int = 0,
) -> dict[str, torch.Tensor]:
    """The plain formula, one tensor at a time, in float64."""
    ema = dict(rec.initial)
    t = 0
    for i, weights in enumerate(rec.steps):
        if i < start_iter:
            ema = dict(weights)
            continue
        if (i + 1) % update_interval:
            continue
        d = min(decay, (1 + t) / (10 + t)) if warmup else decay
        ema = {k: d * ema[k] + (1 - d) * w if k in averaged else w for k, w in weights.items()}
        t += 1
    return ema


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest deviation relative to the tensor's largest magnitude."""
    return float((got.double() - want).abs().max() / want.abs().max().clamp(min=1e-12))


class MixedNet(nn.Module):
    """A float32 block and a bfloat16 block: storage exchange and copy paths in one model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.tail = nn.Sequential(nn.Linear(8, 3), nn.BatchNorm1d(3)).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.head(x).bfloat16()).float()


def resume_job(work_dir: str, kill_at: int = -1) -> dict[str, Any]:
    """24 iterations of MixedNet with the average and a checkpoint every 5 iterations (after
    the average was updated, as the checkpoint plugin saves at priority 90), SIGKILLed after
    iteration ``kill_at`` (0-based), resumed from the newest checkpoint when there is one;
    returns the final average and weights. The harness pieces come from hookrun.testing."""
    from hookrun import Runner

    model = MixedNet()
    runner = Runner(
        model,
        train_dataloader=loader(96, seed=0, shuffle=True),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        max_iters=24,
        work_dir=work_dir,
        writers=(),
        device="cpu",
        plugins={
            "ema": {"decay": 0.9, "update_interval": 2, "start_iter": 3, "buffers": "average"}
        },
        hooks=[SaveEvery(5, epochs=False), KillAt(kill_at + 1 if kill_at >= 0 else None)],
    )
    runner.train(resume="auto")
    return {"ema": runner.plugins["ema"].state_dict(), "model": model.state_dict()}

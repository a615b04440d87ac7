"""Fixtures for the logger's tests: only the logger loads, and a small real training job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables the logger explicitly.
    Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""


class TwoLossModel(nn.Module):
    """A classifier whose training_step returns three loss terms, "loss" first."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        ce = nn.functional.cross_entropy(self.net(x), y)
        l2 = sum((p**2).sum() for p in self.net.parameters()) * 1e-3
        return {"loss": ce + l2, "ce": ce, "l2": l2}

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        out = self.net(x)
        accuracy = (out.argmax(1) == y).float()
        return {"loss": nn.functional.cross_entropy(out, y), "accuracy": accuracy}


class LossRecorder:
    """Ad-hoc hook keeping every iteration's raw loss terms, to smooth them independently."""

    priority = 100

    def __init__(self) -> None:
        self.raw: list[dict[str, torch.Tensor]] = []

    @hookimpl
    def after_train_iter(self, outputs: dict[str, torch.Tensor]) -> None:
        self.raw.append(dict(outputs))

    def smoothed(self, name: str, step: int, window: int) -> float:
        """Mean of ``name`` over the ``window`` iterations ending with iteration ``step``."""
        values = [r[name].item() for r in self.raw[max(0, step - window) : step]]
        return sum(values) / len(values)


def loader(n: int, batch_size: int, seed: int, shuffle: bool = True) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


@pytest.fixture
def make_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A Runner over 25 batches per epoch with the logger enabled with ``logger`` settings."""

    def make(logger: dict[str, Any] | None = None, **overrides: Any) -> Runner:
        torch.manual_seed(0)
        model = TwoLossModel()
        kwargs: dict[str, Any] = dict(
            model=model,
            train_dataloader=loader(200, 8, seed=0),
            val_dataloader=loader(40, 10, seed=1, shuffle=False),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
            max_epochs=2,
            work_dir=tmp_path / "run",
            plugins={"logger": dict(logger or {})},
            config={"runner": {"max_epochs": 2}, "note": "logger test"},
        )
        kwargs.update(overrides)
        return Runner(**kwargs)

    return make


@pytest.fixture
def recorder() -> LossRecorder:
    return LossRecorder()

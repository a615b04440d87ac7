"""Fixtures for the logger's tests: only the logger loads, and a small real training job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from hookrun import Runner, hookimpl
from hookrun.testing import toy_data, two_loss_model


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables the logger explicitly.
    Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""


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
    return toy_data(n, batch_size, shuffle=shuffle, seed=seed)


@pytest.fixture
def make_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A Runner over 25 batches per epoch with the logger enabled with ``logger`` settings."""

    def make(logger: dict[str, Any] | None = None, **overrides: Any) -> Runner:
        model = two_loss_model()
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

"""Fixtures for the timer tests: only the timer loads; loaders and steps sleep known times."""

from __future__ import annotations

import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookrun import Runner


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables the timer explicitly.
    Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""


class SleepyData(Dataset):
    """``n`` samples of 4 features; fetching a batch sleeps ``delay`` seconds once."""

    def __init__(self, n: int, delay: float) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.x[index]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        time.sleep(self.delay)
        return [self.x[i] for i in indices]


class SleepyModel(nn.Module):
    """Training and validation steps that sleep ``delay`` seconds besides a tiny linear layer."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.delay = delay

    def training_step(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.linear(batch).pow(2).mean()

    def validation_step(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
        time.sleep(self.delay)
        return {"loss": self.linear(batch).pow(2).mean()}


@pytest.fixture
def make_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A Runner whose batches take ``data`` s to load and ``step`` s to train on, with the
    timer configured by ``timer`` and the console captured in ``runner.console.file``."""

    def make(
        timer: dict[str, Any] | None = None,
        data: float = 0.004,
        step: float = 0.008,
        batches: int = 10,
        val_batches: int | None = None,
        batch_size: int = 4,
        **overrides: Any,
    ) -> Runner:
        torch.manual_seed(0)
        model = SleepyModel(step)
        val = None
        if val_batches:
            val = DataLoader(SleepyData(val_batches * batch_size, data), batch_size=batch_size)
        kwargs: dict[str, Any] = dict(
            model=model,
            train_dataloader=DataLoader(
                SleepyData(batches * batch_size, data), batch_size=batch_size
            ),
            val_dataloader=val,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
            max_epochs=1,
            work_dir=tmp_path / "run",
            plugins={"timer": dict(timer or {})},
            writers=(),
        )
        kwargs.update(overrides)
        runner = Runner(**kwargs)
        runner.console = Console(file=StringIO(), width=200, highlight=False)
        return runner

    return make

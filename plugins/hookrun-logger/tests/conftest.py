"""Fixtures for the logger's tests: only the logger loads, and a small real training job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun import Runner
from hookrun.testing import LossRecorder, toy_data, two_loss_model


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables the logger explicitly.
    Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""


@pytest.fixture
def make_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A Runner over 25 batches per epoch with the logger enabled with ``logger`` settings."""

    def make(logger: dict[str, Any] | None = None, **overrides: Any) -> Runner:
        model = two_loss_model()
        kwargs: dict[str, Any] = dict(
            model=model,
            train_dataloader=toy_data(200, 8, seed=0),
            val_dataloader=toy_data(40, 10, shuffle=False, seed=1),
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

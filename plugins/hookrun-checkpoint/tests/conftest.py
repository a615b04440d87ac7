"""Fixtures for the checkpoint tests: only the plugins a test names load; a tiny model whose
validation metric follows a script, so tests decide which epoch is best."""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_testing import EpochTeller, ScriptedModel
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner
from hookrun.testing import assert_same_checkpoint

__all__ = ["EpochTeller", "ScriptedModel"]  # also importable from here, as before


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables the checkpoint plugin explicitly.
    Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""


@pytest.fixture
def make_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A Runner with the checkpoint plugin configured by ``checkpoint``; 4 batches per epoch;
    the console is captured in ``runner.console.file``."""

    def make(
        checkpoint: dict[str, Any] | None = None,
        scores: tuple[float, ...] = (0.5, 0.9, 0.6, 0.7, 0.8),
        **overrides: Any,
    ) -> Runner:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, generator=g))
        model = ScriptedModel(list(scores))
        kwargs: dict[str, Any] = dict(
            model=model,
            train_dataloader=DataLoader(data, batch_size=4, shuffle=True),
            val_dataloader=DataLoader(data, batch_size=8),
            optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
            max_epochs=3,
            work_dir=tmp_path / "run",
            plugins={"checkpoint": dict(checkpoint or {})},
            hooks=[EpochTeller()],
            writers=(),
        )
        kwargs.update(overrides)
        runner = Runner(**kwargs)
        runner.console = Console(file=StringIO(), width=300, highlight=False)
        return runner

    return make


@pytest.fixture
def assert_same_state() -> Callable[[Path, Path], None]:
    """Two checkpoint files hold equal tensors (bit for bit) and equal positions."""
    return assert_same_checkpoint

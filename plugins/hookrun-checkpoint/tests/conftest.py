"""Fixtures for the checkpoint tests: only the plugins a test names load; a tiny model whose
validation metric follows a script, so tests decide which epoch is best."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl


@pytest.fixture(autouse=True)
def only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other installed plugins stay out; each test enables the checkpoint plugin explicitly."""
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
    monkeypatch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ScriptedModel(nn.Module):
    """A linear regression whose validation reports ``accuracy = scores[completed epochs]``."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.scores = scores
        self.epoch = 0

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return (self.linear(x).squeeze(1) - y).pow(2).mean()

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        return {"accuracy": torch.tensor(self.scores[self.epoch - 1])}


class EpochTeller:
    """Tells the model how many epochs are complete before each validation."""

    @hookimpl
    def before_val(self, runner: Any) -> None:
        runner.unwrapped_model.epoch = runner.epoch


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


def tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested checkpoint, by path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}/{i}")


@pytest.fixture
def assert_same_state() -> Callable[[Path, Path], None]:
    """Two checkpoint files hold equal tensors (bit for bit) and equal positions."""

    def check(a: Path, b: Path) -> None:
        left = torch.load(a, weights_only=True)
        right = torch.load(b, weights_only=True)
        left_t, right_t = dict(tensors(left)), dict(tensors(right))
        assert left_t.keys() == right_t.keys()
        assert len(left_t) > 10
        for key, value in left_t.items():
            assert torch.equal(value, right_t[key]), key
        assert left["loop"] == right["loop"]
        assert left["meta"]["iter"] == right["meta"]["iter"]
        assert left.get("scheduler") == right.get("scheduler")

    return check

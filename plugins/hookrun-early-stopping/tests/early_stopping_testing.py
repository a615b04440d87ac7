"""The scripted validation run both of the plugin's test modules train."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl


class ScriptedScore(nn.Module):
    """Linear regression whose n-th validation reports ``{name: script[n]}`` and a loss."""

    def __init__(self, name: str, script: list[float]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.name, self.script = name, script
        self.validations = 0

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return (self.linear(x).squeeze(1) - y).pow(2).mean()

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        value = self.script[self.validations]
        return {self.name: torch.tensor(value, dtype=torch.float64), "loss": torch.tensor(1.0)}


class CountValidations:
    @hookimpl
    def after_val(self, runner: Any) -> None:
        runner.unwrapped_model.validations += 1


def scripted_runner(tmp_path: Path, settings: dict, script: list[float], name: str = "accuracy",
                    **overrides: Any) -> Runner:  # fmt: skip
    """Validation after every epoch reports ``script`` one value per epoch; 2 batches each."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8))
    model = ScriptedScore(name, script)
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=DataLoader(data, batch_size=4),
        val_dataloader=DataLoader(data, batch_size=8),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        max_epochs=len(script),
        work_dir=tmp_path / "run",
        plugins={"early_stopping": {"monitor": name, **settings}},
        hooks=[CountValidations()],
        writers=(),
    )
    kwargs.update(overrides)
    return Runner(**kwargs)


class ScriptedLoss(nn.Module):
    """Its n-th training step's loss is ``script[n]`` (a zero gradient flows to one weight)."""

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.script, self.steps = script, 0

    def training_step(self, batch: Any) -> torch.Tensor:
        value = self.script[self.steps]
        self.steps += 1
        return self.weight.sum() * 0 + value


def scripted_loss_runner(work_dir: Path, script: list[float], settings: dict, **overrides: Any
                         ) -> Runner:  # fmt: skip
    """``len(script)`` iterations of :class:`ScriptedLoss` without validation, ``early_stopping``
    watching ``train/loss`` with ``settings``; batches of 2 over 8 samples (4 an epoch)."""
    model = ScriptedLoss(script)
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        max_iters=len(script),
        work_dir=work_dir,
        plugins={"early_stopping": {"monitor": "train/loss", **settings}},
        writers=("jsonl",),
    )
    kwargs.update(overrides)
    return Runner(**kwargs)

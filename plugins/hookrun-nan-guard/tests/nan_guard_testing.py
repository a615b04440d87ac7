"""The injection of NaN and inf shared by the nan_guard tests."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hookrun import hookimpl


class Inject:
    """Puts a NaN or an inf into the run at the iterations in ``at``: into the input batch,
    the loss (via the criterion) or one gradient (``after_backward``)."""

    def __init__(self, where: str, at: set[int]) -> None:
        self.where, self.at, self.iter = where, at, -1

    @hookimpl
    def before_train_iter(self, runner: Any, batch: Any) -> None:
        self.iter = runner.iter
        if self.where == "input" and runner.iter in self.at:
            batch[0][0, 0] = math.nan

    def criterion(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(outputs, targets)
        bad = self.where == "loss" and self.iter in self.at
        return loss * math.nan if bad else loss

    @hookimpl
    def after_backward(self, runner: Any) -> None:
        if self.where == "grad" and runner.iter in self.at:
            runner.unwrapped_model.weight.grad[0, 0] = math.inf


class HostReads:
    """Counts calls of the Tensor methods that read a value to the host (the way
    ``tests/test_syncs_and_memory.py`` does), snapshotted at the start of every iteration."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")

    def __init__(self, monkeypatch: Any) -> None:
        self.count = 0
        self.at_iter_start: list[int] = []
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(getattr(torch.Tensor, name)))

    def counted(self, original: Any) -> Any:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(tensor, *args, **kwargs)

        return read

    @hookimpl
    def before_train_iter(self) -> None:
        self.at_iter_start.append(self.count)

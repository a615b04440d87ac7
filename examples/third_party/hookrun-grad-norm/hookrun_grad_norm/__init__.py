"""A gradient-norm logger and a CSV writer for hookrun, registered through entry points."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from hookrun import Plugin, PluginSettings, Priority, Writer, hookimpl


class GradNormSettings(PluginSettings):
    norm_type: float = Field(
        2.0, gt=0, description="Which p-norm of all gradients together (2.0: the Euclidean norm)."
    )
    name: str = Field(
        "grad_norm", min_length=1, description="Scalar name; writers receive `train/<name>`."
    )


class GradNorm(Plugin):
    """Records the norm of all gradients at each optimizer step, before clipping."""

    name = "grad_norm"
    Settings = GradNormSettings
    priority = Priority.NORMAL
    enabled_by_default = False

    @hookimpl
    def before_optimizer_step(self, runner: Any, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if grads:  # a tensor on the device: the scalar store reads it at the logging interval
            p = self.settings.norm_type
            norms = torch._foreach_norm(grads, p)
            total = torch.linalg.vector_norm(torch.stack(norms), p)
            runner.scalars.put("train/" + self.settings.name, total)


class CsvWriter(Writer):
    """Appends ``step,name,value`` rows to ``<work_dir>/scalars.csv``."""

    def __init__(self, work_dir: str | Path, filename: str = "scalars.csv") -> None:
        super().__init__(work_dir)
        self.path = self.work_dir / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        self._file = self.path.open("a", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(["step", "name", "value"])

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        for name, value in scalars.items():
            self._csv.writerow([step, name, float(value)])

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

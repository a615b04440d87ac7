"""Early stopping and a CSV writer for hookrun, registered through entry points."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from hookrun import (
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    Writer,
    better,
    hookimpl,
    metric_rule,
)


class EarlyStoppingSettings(PluginSettings):
    monitor: str = Field("loss", description="Validation metric to watch (a key of the metrics).")
    patience: int = Field(3, ge=1, description="Validations without improvement before stopping.")
    min_delta: float = Field(0.0, ge=0, description="Smallest change that counts as improvement.")
    rule: Literal["less", "greater", "auto"] = Field(
        "auto",
        description="Whether lower or higher is better; auto: decided from the monitor's name "
        "by `hookrun.metric_rule` (loss, error, ...: less; accuracy, auc, ...: greater).",
    )

    @model_validator(mode="after")
    def _rule_is_decidable(self) -> EarlyStoppingSettings:
        if self.rule == "auto" and metric_rule(self.monitor) is None:
            raise ValueError(
                f"cannot tell from the metric name {self.monitor!r} whether greater or less is "
                "better; set rule: greater or rule: less"
            )
        return self

    @property
    def direction(self) -> Literal["less", "greater"] | None:
        """The rule with ``auto`` resolved from the monitor's name (decidable, see above)."""
        return metric_rule(self.monitor) if self.rule == "auto" else self.rule


class EarlyStopping(Plugin):
    """Sets ``runner.stop_training`` after ``patience`` validations without improvement."""

    name = "early_stopping"
    Settings = EarlyStoppingSettings
    priority = Priority.LOW
    enabled_by_default = False

    def __init__(self, settings: EarlyStoppingSettings | None = None) -> None:
        super().__init__(settings)
        self.best: float | None = None
        self.bad_validations = 0

    @hookimpl
    def after_val_epoch(self, runner: Any, metrics: Mapping[str, float]) -> None:
        monitor = self.settings.monitor
        if monitor not in metrics:
            have = ", ".join(sorted(metrics))
            raise ConfigError(
                f"plugins.early_stopping.monitor: no metric {monitor!r} (have: {have})"
            )
        value = metrics[monitor]
        if self._improved(value):
            self.best, self.bad_validations = value, 0
            return
        self.bad_validations += 1
        if self.bad_validations >= self.settings.patience:
            runner.info(
                f"early stopping: {monitor} did not improve for {self.bad_validations} "
                f"validations (best {self.best:.4g})"
            )
            runner.stop_training = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_validations = state["best"], state["bad_validations"]

    def _improved(self, value: float) -> bool:
        if self.best is None or math.isnan(self.best):
            return not math.isnan(value)
        rule = self.settings.direction
        return rule is not None and better(rule, value, self.best, self.settings.min_delta)


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

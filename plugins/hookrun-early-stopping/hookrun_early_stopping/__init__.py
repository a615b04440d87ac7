"""hookrun-early-stopping: stop training when a validation metric stops improving.

After each validation of a training run the monitored metric is compared with the best so
far, as Lightning's and Ignite's ``EarlyStopping`` compare it: an improvement by more than
``min_delta`` resets the wait count, anything else adds one, and ``patience`` validations
without improvement set ``runner.stop_training``. Thresholds and a non-finite value stop at
once. The state lives in checkpoints; every rank decides on rank 0's value, so all stop
together. The checkpoint plugin saves the state training stopped in.

A training scalar (``monitor: train/loss``, any ``train/`` name) is checked instead every
``log_interval`` iterations, no validation needed: its mean over those iterations on rank 0
(what that iteration's report writes, unless an epoch ended in between) is given to every
rank, and ``patience`` counts such checks.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from hookrun import (
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    all_gather_object,
    better,
    hookimpl,
    resolve_rule,
)

__all__ = ["EarlyStopping", "EarlyStoppingSettings"]

Rule = Literal["greater", "less"]
TRAIN = "train/"


class EarlyStoppingSettings(PluginSettings):
    """Settings of the ``early_stopping`` plugin."""

    monitor: str = Field(
        "loss",
        min_length=1,
        description="Validation metric to watch (a key validation reports), or a training "
        "scalar (`train/loss`, any `train/` name), checked every `log_interval` iterations.",
    )
    rule: Literal["greater", "less", "auto"] = Field(
        "auto",
        validate_default=True,
        description="Whether a greater or a smaller `monitor` is better; `auto` decides from the "
        "whole words of the name (loss, error, mse, ...: less; accuracy, auc, f1, ...: greater) "
        "and is an error for a name with none of them.",
    )
    patience: int = Field(
        3,
        ge=1,
        description="Validations (checks, for a `train/` monitor) in a row without improvement "
        "before training stops.",
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        description="An improvement is a change by more than `min_delta` in the better direction.",
    )
    stopping_threshold: float | None = Field(
        None,
        description="Stop as soon as `monitor` is better than this value (`null`: never).",
    )
    divergence_threshold: float | None = Field(
        None,
        description="Stop as soon as `monitor` is worse than this value (`null`: never).",
    )
    check_finite: bool = Field(True, description="Stop as soon as `monitor` is NaN or infinite.")
    min_epochs: int | None = Field(
        None,
        ge=1,
        description="No stop before this many epochs are complete (`null`: no minimum); the "
        "wait count keeps counting meanwhile.",
    )

    @field_validator("rule")
    @classmethod
    def _rule_is_decidable(cls, value: str, info: ValidationInfo) -> str:
        monitor = info.data.get("monitor")
        if monitor is not None:
            resolve_rule(monitor, value)
        return value

    @property
    def direction(self) -> Rule:
        """``rule`` with ``auto`` resolved from the monitor's name (decidable, see above)."""
        return resolve_rule(self.monitor, self.rule)


class EarlyStopping(Plugin[EarlyStoppingSettings]):
    """Sets ``runner.stop_training`` when the monitored validation metric stops improving."""

    name = "early_stopping"
    Settings = EarlyStoppingSettings
    priority = Priority.LOW  # decides before the checkpoint plugin (VERY_LOW) saves the state
    enabled_by_default = False

    def __init__(self, settings: EarlyStoppingSettings | None = None) -> None:
        super().__init__(settings)
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None
        self.training = False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self.wait = int(state["wait"])
        self.stopped_epoch = state["stopped_epoch"]

    @hookimpl
    def before_run(self, runner: RunnerProtocol) -> None:
        """A new training run starts from nothing; a resume then restores the state."""
        if runner.mode == "train":
            self.best, self.wait, self.stopped_epoch = None, 0, None

    @property
    def watches_training(self) -> bool:
        """Whether ``monitor`` is a training scalar (checked every ``log_interval`` iterations)."""
        return self.settings.monitor.startswith(TRAIN)

    def unused_hooks(self, runner: RunnerProtocol) -> Collection[str]:
        """A training scalar needs no validation; a validation metric no iteration's hook."""
        return ("after_val_epoch",) if self.watches_training else ("after_train_iter",)

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        if runner.val_dataloader is None and not self.watches_training:
            raise ConfigError(
                f"plugins.early_stopping: needs a val_dataloader to watch {self.settings.monitor!r}"
            )
        self.training = True

    @hookimpl
    def after_train(self) -> None:
        self.training = False

    @hookimpl
    def after_val_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        """Count this validation; stop training when it says so (not for ``runner.val()``)."""
        if not self.training:
            return
        monitor = self.settings.monitor
        if monitor not in metrics:
            raise ConfigError(
                f"plugins.early_stopping.monitor: validation reports no metric {monitor!r} "
                f"(it reports: {', '.join(metrics) or 'nothing'})"
            )
        value = float(all_gather_object(float(metrics[monitor]))[0])  # rank 0's value
        reason = self._update(value)
        if reason is None:
            return
        epochs = runner.epoch
        minimum = self.settings.min_epochs
        if minimum is not None and epochs < minimum:
            return
        self.stopped_epoch = epochs
        runner.stop_training = True
        runner.info(f"early_stopping: {reason}; training stops after epoch {epochs}")

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        """Every ``log_interval`` iterations: rank 0's mean of the monitored training scalar
        over them, given to every rank (one small gather), counted as a validation is."""
        if not runner.every_n_iters(runner.log_interval):
            return
        monitor = self.settings.monitor
        mine = None
        if runner.is_main:
            mine = (runner.scalars.mean([monitor], window=runner.log_interval).get(monitor),
                    [n for n in runner.scalars.names() if n.startswith(TRAIN)])  # fmt: skip
        value, names = all_gather_object(mine)[0]
        if value is None:
            raise ConfigError(
                f"plugins.early_stopping.monitor: training records no scalar {monitor!r} "
                f"(it records: {', '.join(names) or 'nothing'})"
            )
        reason = self._update(float(value))
        minimum = self.settings.min_epochs
        if reason is None or (minimum is not None and runner.epoch < minimum):
            return
        self.stopped_epoch = runner.epoch
        runner.stop_training = True
        runner.info(f"early_stopping: {reason}; training stops at iteration {runner.iter + 1}")

    def _update(self, value: float) -> str | None:
        """Take one validation's value; the reason to stop, or None."""
        s, rule = self.settings, self.settings.direction
        monitor = s.monitor
        if s.check_finite and not math.isfinite(value):
            return f"{monitor} is {value}"
        if s.stopping_threshold is not None and better(rule, value, s.stopping_threshold):
            return f"{monitor} {value:.6g} is better than stopping_threshold {s.stopping_threshold}"
        if s.divergence_threshold is not None and better(rule, s.divergence_threshold, value):
            return (
                f"{monitor} {value:.6g} is worse than divergence_threshold {s.divergence_threshold}"
            )
        if not math.isnan(value) and (
            self.best is None or better(rule, value, self.best, s.min_delta)
        ):
            self.best, self.wait = value, 0
            return None
        self.wait += 1
        if self.wait < s.patience:
            return None
        checks = "checks" if self.watches_training else "validations"
        return f"{monitor} did not improve for {self.wait} {checks} (best {self.best:.6g})"

"""The config file's model: what each key is, its type and description. Apart from
:mod:`hookrun.config.file` (reading, overriding, validating a file) so that the JSON Schema
(:mod:`hookrun.config.schema`), which
extends it with each plugin's settings, needs no file loading."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hookrun.config.arguments import RunnerArguments
from hookrun.config.optimizers import OptimizerSections
from hookrun.config.schedulers import SchedulerSections


class RunnerConfig(RunnerArguments):
    """The ``runner:`` section: exactly the Runner's plain arguments (``RunnerArguments``)."""


class Config(BaseModel):
    """The whole config file."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    task: str = Field(
        description="What builds the model and data: `module:callable`, or "
        "`path/to/file.py:callable` relative to the config file.",
        pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$",
    )
    task_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the task callable."
    )
    runner: RunnerConfig = Field(
        default_factory=lambda: RunnerConfig.model_validate({}), description="Runner arguments."
    )
    plugins: dict[str, Any] = Field(
        default_factory=dict,
        description="Plugin name to a settings mapping (enable and "
        "configure), true (enable with defaults) or false (disable).",
    )
    optimizer: OptimizerSections | None = Field(
        None,
        description="The optimizer, built over the task's model: `type` and its keywords "
        "(the task then returns none); or a mapping of names to such sections, each with "
        "`params:` naming the submodule it trains.",
    )
    scheduler: SchedulerSections | None = Field(
        None,
        description="The learning-rate schedule: an optional warm-up, then `main`; or a "
        "mapping of optimizer names to such sections.",
    )

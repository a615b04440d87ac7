"""The YAML config file: parsed, overridden with ``--set``, validated as a whole.

Every mistake in the file is collected before any work starts and reported as one line
each, dotted path first (``plugins.ema.decay: Input should be less than 1 (got 1.5)``).
Plugin sections are checked by the plugin manager, with each plugin's own ``Settings``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hookrun.arguments import RunnerArguments, error_lines
from hookrun.errors import ConfigError, HookrunError, validation_lines
from hookrun.optimizers import (
    OptimizerConfig,
    SchedulerConfig,
    optimizer_errors,
    schedule_errors,
    scheduler_errors,
)
from hookrun.schema import schema, settings_rows
from hookrun.task import (
    check_task,
    check_task_result,
    load_task,
    resolve_task_file,
    split_task,
    task_args_errors,
)

# the CLI, the docs and the tests import these from here
__all__ = [
    "Config",
    "LoadedConfig",
    "RunnerConfig",
    "apply_overrides",
    "check_task_result",
    "load",
    "load_task",
    "schema",
    "settings_rows",
    "validate",
]


class RunnerConfig(RunnerArguments):
    """The ``runner:`` section: exactly the Runner's plain arguments (``RunnerArguments``)."""


class Config(BaseModel):
    """The whole config file."""

    model_config = ConfigDict(extra="forbid")

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
    optimizer: OptimizerConfig | None = Field(
        None,
        description="The optimizer, built over the task's model: `type` and its keywords "
        "(the task then returns none).",
    )
    scheduler: SchedulerConfig | None = Field(
        None, description="The learning-rate schedule: an optional warm-up, then `main`."
    )


@dataclass
class LoadedConfig:
    """A validated config: ``data`` holds every key with defaults filled in."""

    path: Path
    data: dict[str, Any]

    @property
    def runner(self) -> dict[str, Any]:
        return self.data["runner"]

    @property
    def work_dir(self) -> Path:
        return Path(self.runner["work_dir"])

    def resolved(self) -> dict[str, Any]:
        """The config to save beside the run: task and work_dir as absolute paths, so the
        saved file works from any folder."""
        data = yaml.safe_load(yaml.safe_dump(self.data))
        target, attr = split_task(data["task"])
        if target.endswith(".py"):
            data["task"] = f"{resolve_task_file(target, self.path)}:{attr}"
        data["runner"]["work_dir"] = str(self.work_dir.resolve())
        return data


def load(
    path: str | Path, overrides: Sequence[str] = (), work_dir: str | Path | None = None
) -> LoadedConfig:
    """Read, override and validate a config file; raises ConfigError with every problem."""
    path = Path(path)
    raw = read_yaml(path)
    errors = apply_overrides(raw, overrides)
    if work_dir is not None:
        runner = raw.setdefault("runner", {})
        if isinstance(runner, dict):
            runner["work_dir"] = str(work_dir)
    errors += validate(raw, path)
    if errors:
        raise ConfigError(errors)
    data = Config.model_validate(raw).model_dump(mode="json", exclude_none=False)
    for section in ("optimizer", "scheduler"):  # keywords as given: no pydantic defaults
        if data[section] is not None:
            data[section] = raw[section]
    interval = (raw.get("scheduler") or {}).get("interval")
    if interval:  # one source: the runner steps the schedule at its section's interval
        data["runner"]["scheduler_interval"] = interval
    return LoadedConfig(path=path, data=data)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys (task, runner, plugins, ...)")
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """Apply ``a.b=value`` overrides in place (values parsed as YAML); returns errors."""
    errors = []
    for item in overrides:
        key, sep, text = item.partition("=")
        keys = key.strip().split(".")
        if not sep or not all(keys):
            errors.append(f"--set {item}: expected KEY=VALUE with a dotted KEY (a.b=1)")
            continue
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            errors.append(f"--set {item}: value is not valid YAML")
            continue
        node = data
        for depth, part in enumerate(keys[:-1]):
            child = node.get(part)
            if child is None or isinstance(child, bool):  # `ema: true` -> `ema: {decay: ...}`
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(f"--set {item}: {'.'.join(keys[: depth + 1])} is not a mapping")
                break
            node = child
        else:
            node[keys[-1]] = value
    return errors


def validate(raw: dict[str, Any], path: Path) -> list[str]:
    """Every error of the file: structure and runner, task target, writers, plugins."""
    errors: list[str] = []
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        errors += _lines(exc)
        config = None
    task = raw.get("task")
    if isinstance(task, str) and ":" in task:
        found = check_task(task, path)
        errors += found or task_args_errors(task, path, raw.get("task_args", {}))
    runner = raw.get("runner")
    if isinstance(runner, dict) and "writers" in runner:
        from hookrun.writers import writer_errors

        errors += writer_errors(runner["writers"])
    runner = runner if isinstance(runner, dict) else {}
    if config is not None:
        errors += device_errors(config.runner)
        errors += work_dir_errors(config.runner.work_dir)
    errors += _interval_errors(raw.get("scheduler"), runner)
    optimizer = optimizer_errors(raw["optimizer"]) if "optimizer" in raw else []
    scheduler = scheduler_errors(raw["scheduler"]) if "scheduler" in raw else []
    if config is not None and config.scheduler is not None:
        tried = not optimizer and not scheduler and config.optimizer is not None
        declared = raw["optimizer"] if tried else None  # the throwaway optimizer's section
        errors += schedule_errors(raw["scheduler"], config.runner.model_dump(), declared)
    errors += optimizer + scheduler
    plugins = raw.get("plugins")
    if isinstance(plugins, dict):
        errors += check_plugins(plugins)
    return errors if errors or config is not None else ["config: invalid"]


def device_errors(runner: RunnerConfig) -> list[str]:
    """A device that is not here (``cuda`` without CUDA, an index beyond the GPUs, ``meta``)
    and what the device cannot serve (``amp: fp16``, ``sync_bn`` without CUDA), as the
    Runner finds them; torch is imported only for a device other than ``auto`` and ``cpu``
    or for one of those settings."""
    if runner.device in ("auto", "cpu") and runner.amp != "fp16" and not runner.sync_bn:
        return []
    from hookrun.arguments import device_feature_errors, resolve_device

    try:
        device = resolve_device(runner.device, int(os.environ.get("LOCAL_RANK", "0") or 0))
    except ConfigError as exc:
        return exc.lines
    return device_feature_errors(runner.amp, runner.sync_bn, runner.strategy, device)


def work_dir_errors(work_dir: str) -> list[str]:
    """Whether the run can create and write its folder: its nearest existing ancestor (or
    itself) is a folder this process may write in, on a file system that is writable and
    not full. Nothing is created."""
    path = Path(work_dir).expanduser()
    where = "runner.work_dir"
    if path.exists() and not path.is_dir():
        return [f"{where}: {work_dir} exists and is not a folder"]
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return [f"{where}: cannot create {work_dir}: {existing} is a file, not a folder"]
    try:
        stat = os.statvfs(existing)
    except OSError:
        stat = None
    if stat is not None and stat.f_flag & os.ST_RDONLY:
        return [f"{where}: cannot write in {existing}: read-only file system"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{where}: cannot write in {existing}: permission denied"]
    if stat is not None and stat.f_bavail * stat.f_frsize < 2**20:
        return [f"{where}: no space left on the device holding {existing}"]
    return []


def _interval_errors(scheduler: Any, runner: dict[str, Any]) -> list[str]:
    """The schedule's interval is said once: in ``scheduler.interval`` or the runner's."""
    own = scheduler.get("interval") if isinstance(scheduler, dict) else None
    other = runner.get("scheduler_interval")
    if own and other and own != other:
        return [
            f"scheduler.interval: {own!r} contradicts runner.scheduler_interval {other!r}; "
            "keep one of them"
        ]
    return []


def _lines(exc: ValidationError) -> list[str]:
    """pydantic errors as lines; the runner section's through ``hookrun.arguments`` (as the
    Runner reports them), the rest with did-you-mean against the top-level keys."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        if len(loc) > 1 and loc[0] == "runner":
            lines += error_lines([{**err, "loc": loc[1:]}])
        elif err["type"] == "string_pattern_mismatch" and loc == ("task",):
            lines.append(
                "task: expected 'module:callable' or 'path/to/file.py:callable' "
                f"(got {err['input']!r})"
            )
        else:
            lines += validation_lines(_OneError(err), "", Config.model_fields)
    return lines


class _OneError:
    """Feeds one pydantic error to ``validation_lines``."""

    def __init__(self, err: Any) -> None:
        self.err = err

    def errors(self) -> list[Any]:
        return [self.err]


def check_plugins(plugins: dict[str, Any]) -> list[str]:
    """Run the plugin manager's own selection and validation; collect its lines."""
    from hookrun.manager import PluginManager

    try:
        PluginManager(plugins)
    except HookrunError as exc:
        return exc.lines
    return []

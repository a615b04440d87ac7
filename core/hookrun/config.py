"""The YAML config file: parsed, overridden with ``--set``, validated as a whole.

Every mistake in the file is collected before any work starts and reported as one line
each, dotted path first (``plugins.ema.decay: Input should be less than 1 (got 1.5)``).
Plugin sections are checked by the plugin manager, with each plugin's own ``Settings``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hookrun.arguments import RunnerArguments, error_lines
from hookrun.errors import ConfigError, HookrunError, validation_lines
from hookrun.schema import schema, settings_rows
from hookrun.task import check_task, check_task_result, load_task, resolve_task_file, split_task

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
    data = Config.model_validate(raw).model_dump(mode="json")
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
        errors += check_task(task, path)
    runner = raw.get("runner")
    if isinstance(runner, dict) and "writers" in runner:
        from hookrun.writers import writer_errors

        errors += writer_errors(runner["writers"])
    plugins = raw.get("plugins")
    if isinstance(plugins, dict):
        errors += check_plugins(plugins)
    return errors if errors or config is not None else ["config: invalid"]


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

"""The config file validated as a whole (read and overridden by :mod:`hookrun.config.reading`).

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
from pydantic import ValidationError

from hookrun.config.arguments import error_lines, path_problem
from hookrun.config.model import Config, RunnerConfig
from hookrun.config.optimizers import SHAPES, optimizer_errors
from hookrun.config.reading import apply_overrides, read_yaml
from hookrun.config.schedulers import (
    schedule_errors,
    schedule_interval,
    scheduler_errors,
    scheduler_sections,
)
from hookrun.config.schema import schema, settings_rows
from hookrun.config.task import (
    check_task,
    check_task_result,
    load_task,
    resolve_task_file,
    split_task,
    task_args_errors,
)
from hookrun.errors import ConfigError, HookrunError, validation_lines

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
    found, manager = _checked(raw, path)
    errors += found
    if errors:
        raise ConfigError(errors)
    data = Config.model_validate(raw).model_dump(mode="json", exclude_none=False)
    for section in ("optimizer", "scheduler"):  # keywords as given: no pydantic defaults
        if data[section] is not None:
            data[section] = raw[section]
    if raw.get("scheduler"):  # one source: the runner steps the schedules at their interval
        data["runner"]["scheduler_interval"] = schedule_interval(raw["scheduler"], data["runner"])
    reported = None if manager is None else manager.report_interval()
    if reported is not None and "log_interval" not in raw.get("runner", {}):
        data["runner"]["log_interval"] = reported[1]  # one knob: the plugin's interval
    return LoadedConfig(path=path, data=data)


def validate(raw: dict[str, Any], path: Path) -> list[str]:
    """Every error of the file: structure and runner, task target, writers, plugins."""
    return _checked(raw, path)[0]


def _checked(raw: dict[str, Any], path: Path) -> tuple[list[str], Any]:
    """:func:`validate`'s lines, and the plugin manager the ``plugins`` section built (None
    without one, or with errors): built once, the interval checks and defaults ask it."""
    plugins = raw.get("plugins")
    manager, plugin_lines = _plugin_manager(plugins) if isinstance(plugins, dict) else (None, [])
    errors: list[str] = []
    refused: set[tuple[Any, ...]] = set()  # what pydantic refused: no cross-check reads it
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        errors += _lines(exc)
        refused = {tuple(_loc(err)[:2]) for err in exc.errors()}
        config = None
    task = raw.get("task")
    if isinstance(task, str) and ("task",) not in refused:
        found = check_task(task, path)
        errors += found or task_args_errors(task, path, raw.get("task_args", {}))
    runner = raw.get("runner")
    if isinstance(runner, dict) and "writers" in runner:
        from hookrun.writers.registry import writer_errors

        errors += writer_errors(runner["writers"])
    runner = runner if isinstance(runner, dict) else {}
    if config is not None:
        errors += device_errors(config.runner)
        errors += work_dir_errors(config.runner.work_dir)
        errors += checkpoint_dir_errors(manager, config.runner.work_dir)
    if not refused & {("runner", "scheduler_interval"), ("scheduler", "interval")}:
        errors += _interval_errors(raw.get("scheduler"), runner)
    if config is not None:
        errors += _log_interval_errors(manager, raw, config.runner.log_interval)
    optimizer = optimizer_errors(raw["optimizer"]) if "optimizer" in raw else []
    scheduler = scheduler_errors(raw["scheduler"]) if "scheduler" in raw else []
    if config is not None and config.scheduler is not None:
        tried = not optimizer and not scheduler and config.optimizer is not None
        declared = raw["optimizer"] if tried else None  # the throwaway optimizer's section
        errors += schedule_errors(raw["scheduler"], config.runner.model_dump(), declared)
    errors += optimizer + scheduler + plugin_lines
    return (errors if errors or config is not None else ["config: invalid"]), manager


def device_errors(runner: RunnerConfig) -> list[str]:
    """A device that is not here (``cuda`` without CUDA, an index beyond the GPUs, ``meta``)
    and what the device cannot serve (``amp: fp16``, ``sync_bn`` without CUDA), as the
    Runner finds them; torch is imported only for a device other than ``auto`` and ``cpu``
    or for one of those settings."""
    if runner.device in ("auto", "cpu") and runner.amp != "fp16" and not runner.sync_bn:
        return []
    from hookrun.config.devices import device_feature_errors, resolve_device

    try:
        device = resolve_device(runner.device, int(os.environ.get("LOCAL_RANK", "0") or 0))
    except ConfigError as exc:
        return exc.lines
    return device_feature_errors(runner.amp, runner.sync_bn, runner.strategy, device)


def work_dir_errors(work_dir: str) -> list[str]:
    """Whether the run can create and write its folder (:func:`place_errors`)."""
    return place_errors("runner.work_dir", work_dir, folder=True)


def checkpoint_dir_errors(manager: Any, work_dir: str) -> list[str]:
    """Whether the run can create and write the local folder the first plugin that declares
    one keeps the checkpoints in (:meth:`hookrun.Plugin.checkpoint_dir`, a folder inside
    ``work_dir`` when relative), as the work dir is checked: a file there, or on the way, is
    found before anything trains. The line names the plugin's setting
    (:attr:`hookrun.Plugin.checkpoint_dir_setting`). A URL's storage is not asked here."""
    from hookrun.engine.workdir import declared_checkpoint_dir

    if manager is None:
        return []
    declared = declared_checkpoint_dir(Path(work_dir), manager.plugins.values())
    if declared is None:
        return []
    plugin, folder = declared
    if not isinstance(folder, Path):  # a URL
        return []
    setting = getattr(plugin, "checkpoint_dir_setting", None)
    where = f"plugins.{getattr(plugin, 'name', '')}" + (f".{setting}" if setting else "")
    return place_errors(where, folder, folder=True)


def place_errors(where: str, path: str | Path, folder: bool) -> list[str]:
    """Whether hookrun can create and write ``path``, a folder (``folder``) or a file: a name
    file systems take, no file where the folder goes (no folder where the file goes), and its
    nearest existing ancestor (or itself) a folder this process may write in, on a file
    system that is writable and not full. Nothing is created. ``where`` names the setting or
    argument in the line; the work dir, ``export``'s OUT, ``schedule --plot`` and ``plugins
    new --dir`` are checked here."""
    problem = path_problem(str(path))
    if problem:
        return [f"{where}: {problem} (got {str(path)!r})"]
    try:
        return _place_errors(where, Path(path), folder)
    except OSError as exc:  # e.g. a folder on the way this process may not look into
        return [f"{where}: cannot check {path}: {exc.strerror}"]


def _place_errors(where: str, path: Path, folder: bool) -> list[str]:
    if path.exists():
        if folder and not path.is_dir():
            return [f"{where}: {path} exists and is not a folder"]
        if not folder and path.is_dir():
            return [f"{where}: {path} is a folder; name the file to write"]
        existing = path if folder else path.parent  # a file is replaced in its folder
    else:
        existing = path.parent
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if not existing.is_dir():
            return [f"{where}: cannot create {path}: {existing} is a file, not a folder"]
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
    """The schedules' interval is said once: in ``scheduler.interval`` (each named
    section's the same) or the runner's."""
    said = [
        (f"{where}.interval", one.get("interval"))
        for _, where, one in scheduler_sections(scheduler)
        if isinstance(one, dict) and one.get("interval") in ("iter", "epoch")  # else pydantic's
    ]
    other = runner.get("scheduler_interval")
    if other:
        said.insert(0, ("runner.scheduler_interval", other))
    first, value = said[0] if said else ("", None)
    return [
        f"{where}: {own!r} contradicts {first} {value!r}; keep one of them"
        for where, own in said[1:]
        if own != value
    ]


def _log_interval_errors(manager: Any, raw: dict[str, Any], log_interval: int) -> list[str]:
    """A plugin reports at the core's reports, so its interval is a multiple of
    ``runner.log_interval`` (which defaults to it when only the plugin's is given)."""
    found = None if manager is None else manager.report_interval()
    if found is None or "log_interval" not in raw.get("runner", {}):
        return []
    where, interval = found
    if interval % log_interval == 0:
        return []
    return [
        f"{where}: {interval} is not a multiple of runner.log_interval "
        f"({log_interval}); lines can only be printed at the core's reports"
    ]


def _lines(exc: ValidationError) -> list[str]:
    """pydantic errors as lines; the runner section's through ``hookrun.config.arguments`` (as the
    Runner reports them), the rest with did-you-mean against the top-level keys."""
    lines = []
    for err in exc.errors():
        loc = _loc(err)
        err = {**err, "loc": loc}
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


def _loc(err: Any) -> tuple[Any, ...]:
    """A pydantic error's location without the shape tag of the ``optimizer:`` or
    ``scheduler:`` key (one section or named ones), as the file spells the path."""
    loc = tuple(err["loc"])
    if len(loc) > 1 and loc[0] in ("optimizer", "scheduler") and loc[1] in SHAPES:
        return loc[:1] + loc[2:]
    return loc


class _OneError:
    """Feeds one pydantic error to ``validation_lines``."""

    def __init__(self, err: Any) -> None:
        self.err = err

    def errors(self) -> list[Any]:
        return [self.err]


def _plugin_manager(plugins: dict[str, Any]) -> tuple[Any, list[str]]:
    """The plugin manager's own selection and validation: the manager, or None and its
    lines."""
    from hookrun.hooks.manager import PluginManager

    try:
        return PluginManager(plugins), []
    except HookrunError as exc:
        return None, exc.lines

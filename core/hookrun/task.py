"""The task callable of a config: found, imported, and what it returns checked.

The file or module is checked without importing user code (``config validate``); importing
and calling it happen only for a run, and errors raised by the user's module propagate.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookrun.discovery import did_you_mean
from hookrun.errors import ConfigError

#: What a task callable may return: the Runner's objects (everything else is config).
TASK_KEYS = (
    "model",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "optimizer",
    "scheduler",
    "criterion",
    "metrics",
    "hooks",
)


def split_task(task: str) -> tuple[str, str]:
    target, _, attr = task.rpartition(":")
    return target, attr


def resolve_task_file(target: str, config_path: Path) -> Path:
    file = Path(target).expanduser()
    return (file if file.is_absolute() else config_path.parent / file).resolve()


def check_task(task: str, config_path: Path) -> list[str]:
    """The task's file or module exists (without importing user code)."""
    target, _ = split_task(task)
    if target.endswith(".py"):
        file = resolve_task_file(target, config_path)
        return (
            []
            if file.is_file()
            else [
                f"task: file not found: {file} (relative paths start at the config file's folder)"
            ]
        )
    with _task_path(config_path):
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
    return [] if found else [f"task: no module named {target!r}"]


class _task_path:
    """Put the config's folder and the current folder on ``sys.path`` while importing."""

    def __init__(self, config_path: Path) -> None:
        self.paths = [str(Path.cwd()), str(config_path.parent.resolve())]

    def __enter__(self) -> None:
        self.added = [p for p in self.paths if p not in sys.path]
        sys.path[:0] = self.added

    def __exit__(self, *exc: object) -> None:
        for p in self.added:
            sys.path.remove(p)


def load_task(task: str, config_path: Path) -> Any:
    """Import the task callable. Errors raised by the user's module propagate as they are."""
    target, attr = split_task(task)
    if target.endswith(".py"):
        file = resolve_task_file(target, config_path)
        name = f"hookrun_task_{file.stem}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"task: cannot import {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(file.parent))  # the task may import its neighbours
        spec.loader.exec_module(module)
        where = str(file)
    else:
        with _task_path(config_path):
            module = importlib.import_module(target)
        where = target
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise ConfigError(f"task: {where} has no {attr!r}{did_you_mean(attr, names)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"task: {where}:{attr} is not callable")
    return obj


def check_task_result(result: Any, task: str) -> dict[str, Any]:
    """The task must return a mapping of Runner objects, ``model`` included."""
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"task: {task} returned {type(result).__name__}; expected a dict with model, "
            "train_dataloader, optimizer, ..."
        )
    errors = [
        f"task: {task} returned unknown key {key!r}{did_you_mean(str(key), TASK_KEYS)} "
        f"(allowed: {', '.join(TASK_KEYS)})"
        for key in result
        if key not in TASK_KEYS
    ]
    if "model" not in result:
        errors.append(f"task: {task} returned no 'model'")
    if errors:
        raise ConfigError(errors)
    return dict(result)

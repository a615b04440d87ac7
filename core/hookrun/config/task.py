"""The task callable of a config: found, imported, and what it returns checked.

The file or module is checked without importing user code (``config validate``); importing
and calling it happen only for a run, and errors raised by the user's module propagate.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookrun.errors import ConfigError
from hookrun.hooks.discovery import did_you_mean

#: What a task callable may return: the Runner's objects (everything else is config).
TASK_KEYS = (
    "model",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
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
    """The task's file or module exists and defines the callable's name (read from its
    source: no user code is imported), with the line the import would give."""
    target, attr = split_task(task)
    if target.endswith(".py"):
        file = resolve_task_file(target, config_path)
        try:
            if not file.is_file():
                return [
                    f"task: file not found: {file} (relative paths start at the config "
                    "file's folder)"
                ]
        except OSError as exc:  # a name too long, a folder it may not look into
            return [f"task: cannot read {file}: {exc.strerror}"]
        return syntax_errors(file) or _missing_name(file, str(file), attr)
    found, source = _module_source(target, config_path)
    if not found:
        return [f"task: no module named {target!r}"]
    if source is None:
        return []
    return syntax_errors(source) or _missing_name(source, target, attr)


def syntax_errors(file: Path) -> list[str]:
    """The task module's syntax error, one line naming the file and line as Python does
    (``task: /p/task.py:3:9: SyntaxError: '(' was never closed``): the source is compiled,
    never executed, so every error the import would raise before running a line is found
    (``return`` outside a function too, which a parse alone lets through). Nothing when the
    file cannot be read: the import reports that."""
    try:
        source = file.read_bytes()
    except OSError:
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning (an invalid escape): not an error
            compile(source, str(file), "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError too
        where = str(file)
        if exc.lineno:
            where += f":{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
        return [f"task: {where}: {type(exc).__name__}: {exc.msg}"]
    except ValueError as exc:  # a NUL byte, before Python 3.12
        return [f"task: {file}: {exc}"]
    return []


def _module_source(target: str, config_path: Path) -> tuple[bool, Path | None]:
    """Whether the module ``target`` can be imported (from the config's folder and the
    current one), and its source file when it is Python source (None: compiled, a
    namespace package), found without importing it."""
    with _task_path(config_path):
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            spec = None
    if spec is None:
        return False, None
    origin = spec.origin or ""
    return True, Path(origin) if origin.endswith(".py") else None


#: Calls through which a module may bind names its source does not show.
DYNAMIC = frozenset({"globals", "setattr", "exec", "eval", "vars", "__import__"})


def _missing_name(file: Path, where: str, attr: str) -> list[str]:
    """The import's line when the module's source binds ``attr``'s first part nowhere at
    its top level; nothing when the source cannot tell (a star import, a module
    ``__getattr__``, a call of :data:`DYNAMIC`, a source that does not parse: the import
    decides)."""
    first = attr.split(".")[0]
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    dynamic = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in DYNAMIC
        for n in ast.walk(tree)
    )
    names = None if dynamic else _top_level_names(tree.body)
    if names is None or first in names:
        return []
    public = sorted(n for n in names if not n.startswith("_"))
    return [f"task: {where} has no {attr!r}{did_you_mean(attr, public)}"]


def _top_level_names(body: list[ast.stmt]) -> set[str] | None:
    """Names a module's top level may bind: its definitions, imports and assignments,
    inside ``if``/``try``/``with``/loops too (any name stored there counts); None when it
    may bind names no source shows (a star import, a module ``__getattr__``)."""
    names: set[str] = set()
    for node in body:
        defined = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if getattr(node, "name", None) == "__getattr__":
            return None
        for child in [node] if defined else ast.walk(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if any(a.name == "*" for a in child.names):
                    return None
                names.update((a.asname or a.name.split(".")[0]) for a in child.names)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
    return names


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


def check_task_result(
    result: Any, task: str, declared: Mapping[str, Any] | None = None, training: bool = False
) -> dict[str, Any]:
    """The task must return a mapping of Runner objects, ``model`` an ``nn.Module``; an
    optimizer or scheduler comes from the task or from the config (``declared``), not both;
    training needs one optimizer."""
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
    else:
        from torch import nn

        if not isinstance(result["model"], nn.Module):
            errors.append(
                f"task: {task} returned model of type {type(result['model']).__name__}; "
                "expected a torch.nn.Module"
            )
    declared = declared or {}
    for key in ("optimizer", "scheduler"):
        if result.get(key) is not None and declared.get(key) is not None:
            errors.append(
                f"{key}: declared in the config and also returned by task {task}; keep one "
                f"(drop the {key}: section, or stop returning it)"
            )
    if training and result.get("optimizer") is None and declared.get("optimizer") is None:
        errors.append(
            f"task: {task} returned no 'optimizer' and the config declares none; return one "
            "or add an optimizer: section (type: AdamW, lr: ...)"
        )
    if training and result.get("train_dataloader") is None:
        errors.append(f"task: {task} returned no 'train_dataloader'")
    if errors:
        raise ConfigError(errors)
    return dict(result)


# -- task_args against the callable's parameters --------------------------------------------


@dataclass(frozen=True)
class Parameters:
    """What a callable accepts as keyword arguments."""

    names: tuple[str, ...]
    required: tuple[str, ...]
    any_keyword: bool  # it has **kwargs


def task_args_errors(task: str, config_path: Path, task_args: Any) -> list[str]:
    """``task_args`` checked against the task callable's parameters, read from its source
    (no user code is imported); empty when the source cannot tell (a callable made at run
    time, a compiled module): the run checks it again with the imported callable."""
    if not isinstance(task_args, Mapping):
        return []
    params = _declared_parameters(task, config_path)
    return [] if params is None else argument_errors(task, params, task_args)


def argument_errors(task: str, params: Parameters, task_args: Mapping[str, Any]) -> list[str]:
    """One ``task_args.<key>`` line per unknown key (did-you-mean) and per missing one."""
    errors = []
    if not params.any_keyword:
        listed = ", ".join(params.names) or "none"
        errors += [
            f"task_args.{key}: {task} takes no argument {key!r}"
            f"{did_you_mean(str(key), params.names)} (arguments: {listed})"
            for key in task_args
            if key not in params.names
        ]
    errors += [
        f"task_args.{name}: required by {task} and missing"
        for name in params.required
        if name not in task_args
    ]
    return errors


def signature_parameters(obj: Any) -> Parameters | None:
    """The parameters of an imported callable (None when Python cannot tell)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    values = signature.parameters.values()
    named = [p for p in values if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.POSITIONAL_ONLY and p.default is p.empty for p in values):
        return None  # cannot be called with keywords alone: let the call say so
    return Parameters(
        tuple(p.name for p in named),
        tuple(p.name for p in named if p.default is p.empty),
        any(p.kind is p.VAR_KEYWORD for p in values),
    )


def _declared_parameters(task: str, config_path: Path) -> Parameters | None:
    target, attr = split_task(task)
    if target.endswith(".py"):
        file: Path | None = resolve_task_file(target, config_path)
    else:
        file = _module_source(target, config_path)[1]
    if file is None or "." in attr:
        return None
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # the import reports it
    found = None
    for node in tree.body:  # the last definition of the name wins, as at import
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == attr:
                found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
            targets = node.targets if isinstance(node, ast.Assign) else [node]
            if any(_binds(t, attr) for t in targets):
                found = None  # bound some other way: only the import can tell
    if isinstance(found, ast.ClassDef):
        init = next(
            (n for n in found.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
            None,
        )
        if init is None or found.bases or found.decorator_list:
            return None
        return _ast_parameters(init.args, skip_first=True)
    if found is None or found.decorator_list:
        return None
    return _ast_parameters(found.args, skip_first=False)


def _binds(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, ast.AnnAssign):
        return _binds(node.target, name)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_binds(e, name) for e in node.elts)
    return False


def _ast_parameters(args: ast.arguments, skip_first: bool) -> Parameters | None:
    positional = list(args.args)[1:] if skip_first else list(args.args)
    if args.posonlyargs and len(args.defaults) < len(args.posonlyargs) + len(args.args):
        return None
    with_default = {a.arg for a in positional[len(positional) - len(args.defaults) :]}
    if len(args.defaults) > len(positional):
        with_default = {a.arg for a in positional}
    names = [a.arg for a in positional] + [a.arg for a in args.kwonlyargs]
    required = [a.arg for a in positional if a.arg not in with_default]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return Parameters(tuple(names), tuple(required), args.kwarg is not None)

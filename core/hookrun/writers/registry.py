"""Writer classes found by name from a ``writers:`` spec: the built-ins and the entry points
of the ``hookrun.writers`` group, with every problem of the spec and of each writer's options
found before the run starts."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from hookrun.errors import ConfigError
from hookrun.hooks.discovery import (
    WRITER_GROUP,
    clash_message,
    clashes,
    clone_folders,
    did_you_mean,
    install_from_clone,
    installed,
)
from hookrun.writers.base import Writer
from hookrun.writers.jsonl import JsonlWriter
from hookrun.writers.tensorboard import TensorBoardWriter

BUILTIN_WRITERS: dict[str, type[Writer]] = {"jsonl": JsonlWriter, "tensorboard": TensorBoardWriter}


def resolve_writers(spec: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Writer classes (or ready instances) with their options; ConfigError with every
    problem of the spec (see ``writer_errors``)."""
    resolved, errors = _resolve(spec)
    if errors:
        raise ConfigError(errors)
    return resolved


def writer_errors(spec: Any) -> list[str]:
    """Every problem of a writers spec, one ``runner.writers...`` line each: its shape,
    unknown names, options a writer's constructor does not take. The Runner and ``config
    validate`` both check through here.

    ``spec``: None, a list of names (or ``Writer`` instances), or a mapping of name to an
    options mapping, null or true (defaults) or false (off).
    """
    return _resolve(spec)[1]


def _resolve(spec: Any) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
    where = "runner.writers"
    entries, errors = _entries(spec, where)
    resolved: list[tuple[Any, dict[str, Any]]] = []
    available = None
    for name, options in entries:
        if isinstance(name, Writer):
            resolved.append((name, {}))
            continue
        cls = BUILTIN_WRITERS.get(name)
        if cls is None:
            available = available or installed(WRITER_GROUP)
            if name not in available:
                own = clone_folders("writers")
                if name in own:
                    errors.append(
                        f"{where}.{name}: writer {name!r} is not installed; "
                        + install_from_clone("writers", name)
                    )
                else:
                    known = {*BUILTIN_WRITERS, *available, *own}
                    errors.append(f"{where}.{name}: unknown writer{did_you_mean(name, known)}")
                continue
            clashing = clashes(WRITER_GROUP).get(name)
            if clashing:
                errors.append(f"{where}.{name}: {clash_message('writer', name, clashing)}")
                continue
            cls = available[name].entry_point.load()
        errors += option_errors(f"{where}.{name}", cls, options)
        resolved.append((cls, options))
    return resolved, errors


def _entries(spec: Any, where: str) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
    """``(name or instance, options)`` pairs of the enabled writers, and shape errors."""
    entries: list[tuple[Any, dict[str, Any]]] = []
    errors: list[str] = []
    if spec is None:
        return entries, errors
    if isinstance(spec, Mapping):
        for name, options in spec.items():
            if not isinstance(name, str):
                errors.append(f"{where}: writer names are strings (got {name!r})")
            elif options is False:
                continue
            elif options is None or options is True:
                entries.append((name, {}))
            elif isinstance(options, Mapping):
                entries.append((name, dict(options)))
            else:
                errors.append(
                    f"{where}.{name}: expected a mapping of options, true or false "
                    f"(got {options!r})"
                )
        return entries, errors
    if isinstance(spec, (list, tuple)):
        for index, name in enumerate(spec):
            if isinstance(name, (str, Writer)):
                entries.append((name, {}))
            else:
                errors.append(f"{where}.{index}: expected a writer name (got {name!r})")
        return entries, errors
    return [], [
        f"{where}: expected a list of writer names or a mapping of name to options (got {spec!r})"
    ]


def option_errors(where: str, cls: type, options: Mapping[str, Any]) -> list[str]:
    """Options the writer's constructor does not take, found before the run starts; ``where``
    is the dotted path of the writer's options in the config."""
    parameters = list(inspect.signature(cls).parameters.values())[1:]  # after work_dir
    values = cls.check_options(options) if issubclass(cls, Writer) else []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return [_placed(where, line) for line in values]
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [
        f"{where}.{option}: unknown option{did_you_mean(option, accepted)} "
        f"(options: {', '.join(accepted) or 'none'})"
        for option in options
        if option not in accepted
    ]
    return unknown or [_placed(where, line) for line in values]


def _placed(where: str, line: str) -> str:
    """A line of ``check_options`` under the writer's path: ``where.<option>: ...`` for a line
    naming an option, ``where: ...`` for one about the writer as a whole (its library)."""
    head = line.partition(":")[0]
    names_an_option = head.replace(".", "").replace("_", "").isalnum()
    return f"{where}.{line}" if names_an_option else f"{where}: {line}"

"""A class a config names by its ``type``, and the keywords the config gives it: the class
found in its home module or by a dotted path, each keyword checked against the signature,
and numbers YAML read as text or as NaN worded, one line each.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from typing import Any

import yaml

from hookrun.errors import ConfigError
from hookrun.hooks.discovery import did_you_mean


def keyword_errors(
    where: str, cls: type, keywords: Mapping[str, Any], skip: tuple[str, ...]
) -> list[str]:
    """Keywords ``cls`` does not take, one line each with a did-you-mean."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    names = [n for n, p in parameters.items() if n not in skip and p.kind is not p.VAR_POSITIONAL]
    return [
        f"{where}.{key}: {cls.__name__} takes no argument {key!r}"
        f"{did_you_mean(str(key), names)} (arguments: {', '.join(names)})"
        for key in keywords
        if key not in names
    ]


def find_class(name: str, home: str) -> type:
    """``name`` in module ``home`` (``AdamW``), or a dotted path (``pkg.mod.Class``)."""
    if "." not in name:
        module = importlib.import_module(home)
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
        known = [n for n in dir(module) if isinstance(getattr(module, n), type)]
        raise ConfigError(f"{home} has no class {name!r}{did_you_mean(name, known)}")
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ConfigError(f"no module named {module_name!r} (from {name!r})") from None
    found = getattr(module, attr, None)
    if not isinstance(found, type):
        raise ConfigError(f"{module_name} has no class {attr!r}")
    return found


def quoted_number_errors(where: str, keywords: Mapping[str, Any]) -> list[str]:
    """Numbers YAML reads as text (``1e-3`` needs a dot: ``1.0e-3``), one line each."""
    lines = []
    for key, value in keywords.items():
        if isinstance(value, str) and value != "auto":
            try:
                number = float(value)
            except ValueError:
                continue
            written = yaml.safe_dump(number).split("\n")[0]  # 1.0e-05: a float to YAML
            lines.append(f"{where}.{key}: {value!r} is text to YAML, not a number; write {written}")
    return lines


def non_finite_errors(where: str, value: Any) -> list[str]:
    """NaN and ±inf anywhere in ``value`` (a keyword, a list such as ``betas``, a parameter
    group), one line each: torch takes most of them silently (``momentum: .nan`` trains
    every weight to NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: Input should be a finite number (got {value!r})"]
    if isinstance(value, Mapping):
        return [e for k, v in value.items() for e in non_finite_errors(f"{where}.{k}", v)]
    if isinstance(value, (list, tuple)):
        return [e for i, v in enumerate(value) for e in non_finite_errors(f"{where}.{i}", v)]
    return []


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type's name when it has none)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__

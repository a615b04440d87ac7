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


#: What a class named in its home module must be, by home: the base class (by name) and
#: the words a refusal uses. Classes the home module merely imports (``Counter``, ``Tensor``
#: in ``torch.optim.lr_scheduler``) are neither found nor suggested.
KINDS = {
    "torch.optim": ("Optimizer", "an optimizer"),
    "torch.optim.lr_scheduler": ("LRScheduler", "a learning-rate scheduler"),
}
#: Schedulers some torch versions do not derive from ``LRScheduler``.
KNOWN_SCHEDULERS = frozenset({"ReduceLROnPlateau"})


def home_classes(module: Any, home: str) -> list[str]:
    """The public classes of ``home`` that are of its kind (:data:`KINDS`): its optimizers or
    learning-rate schedulers, not their base class and not what the module imports."""
    base_name, _ = KINDS.get(home, ("", ""))
    base = getattr(module, base_name, None) if base_name else None
    found = []
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or not isinstance(value, type) or value is base:
            continue
        if not isinstance(base, type) or issubclass(value, base) or name in KNOWN_SCHEDULERS:
            found.append(name)
    return found


def find_class(name: str, home: str) -> type:
    """``name`` in module ``home`` (``AdamW``), one of the classes it offers
    (:func:`home_classes`, suggested from them too), or a dotted path (``pkg.mod.Class``)."""
    if "." not in name:
        module = importlib.import_module(home)
        known = home_classes(module, home)
        found = getattr(module, name, None)
        if isinstance(found, type) and name in known:
            return found
        if isinstance(found, type) and home in KINDS:
            base, kind = KINDS[home]
            what = f"the base class, not {kind}" if name == base else f"not {kind}"
            raise ConfigError(f"{home}.{name} is {what}; name one of {', '.join(known)}")
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

"""Find installed plugins and writers from entry-point metadata, importing none of them.

Kept free of torch, pydantic and pluggy so that ``hookrun plugins list`` starts fast.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

PLUGIN_GROUP = "hookrun.plugins"
WRITER_GROUP = "hookrun.writers"


@dataclass(frozen=True)
class EntryPointInfo:
    """One entry point with the distribution that declares it."""

    name: str
    distribution: str
    version: str
    value: str
    entry_point: EntryPoint

    def as_row(self) -> dict[str, str]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.value,
        }


def installed(group: str) -> dict[str, EntryPointInfo]:
    """Entry points of ``group`` by name, sorted; the first distribution wins a name clash
    (:func:`scan` names them)."""
    return scan(group)[0]


def clashes(group: str) -> dict[str, list[EntryPointInfo]]:
    """Names of ``group`` that two or more distributions register, with each of them."""
    return scan(group)[1]


def scan(group: str) -> tuple[dict[str, EntryPointInfo], dict[str, list[EntryPointInfo]]]:
    """One pass over the entry points of ``group``: :func:`installed` and :func:`clashes`."""
    by_name: dict[str, list[EntryPointInfo]] = {}
    for info in _scan(group):
        by_name.setdefault(info.name, []).append(info)
    found = {name: infos[0] for name, infos in by_name.items()}
    return found, {name: infos for name, infos in by_name.items() if len(infos) > 1}


def clash_message(kind: str, name: str, infos: list[EntryPointInfo]) -> str:
    """``plugin name 'logger' is registered by 2 distributions: a 1.0 (m:X), b 2.0 (n:Y)``."""
    ordered = sorted(infos, key=lambda i: i.distribution)  # sys.path order is no order
    listed = ", ".join(f"{i.distribution} {i.version} ({i.value})" for i in ordered)
    return (
        f"{kind} name {name!r} is registered by {len(infos)} distributions: {listed}; "
        "uninstall all but one"
    )


def _scan(group: str) -> list[EntryPointInfo]:
    """Every entry point of ``group``, one per distribution and name, sorted by name."""
    seen: set[tuple[str, str]] = set()
    found = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        dist = ep.dist
        info = EntryPointInfo(
            name=ep.name,
            distribution=dist.metadata["Name"] if dist is not None else "?",
            version=dist.version if dist is not None else "?",
            value=ep.value,
            entry_point=ep,
        )
        if (info.name, info.distribution) not in seen:
            seen.add((info.name, info.distribution))
            found.append(info)
    return found


def installed_plugins() -> dict[str, EntryPointInfo]:
    return installed(PLUGIN_GROUP)


def blocked_plugins() -> set[str]:
    """Names in ``HOOKRUN_DISABLE_PLUGINS`` (comma-separated): never imported."""
    raw = os.environ.get("HOOKRUN_DISABLE_PLUGINS", "")
    return {name.strip() for name in raw.split(",") if name.strip()}


def autoload_enabled() -> bool:
    """False when ``HOOKRUN_PLUGINS_AUTOLOAD=0``: only plugins the config names load."""
    return os.environ.get("HOOKRUN_PLUGINS_AUTOLOAD", "1").strip().lower() not in {
        "0",
        "false",
        "no",
    }


def did_you_mean(name: str, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string. Case does not
    count (``Adamw`` is ``AdamW``); of choices that differ only in case the first is named."""
    spelled: dict[str, str] = {}
    for choice in map(str, choices):
        spelled.setdefault(choice.lower(), choice)
    close = difflib.get_close_matches(name.lower(), list(spelled), n=1, cutoff=0.6)
    return f" (did you mean {spelled[close[0]]!r}?)" if close else ""


def distribution_name(name: str) -> str:
    """``hookrun-<name with dashes>``: the distribution convention of plugins and writers."""
    return "hookrun-" + name.replace("_", "-")


def install_from_clone(folder: str, name: str) -> str:
    """How to install one of hookrun's own distributions: ``pip install`` of its folder in
    this clone of the repository (the package index does not have them), else of the folder
    a clone would hold; the one place to change when the index has them."""
    path = clone_folders(folder).get(name)
    if path is not None:
        return f"pip install {path}"
    return f"pip install ./{folder}/{distribution_name(name)} from a clone of hookrun"


def clone_folders(folder: str) -> dict[str, Path]:
    """Name to folder of the distributions in ``plugins/`` or ``writers/`` beside the core,
    when hookrun runs from a clone of its repository (empty otherwise): the folder layout is
    how the core knows its own plugins and writers, with no list of their names to keep."""
    spec = importlib.util.find_spec("hookrun")
    if spec is None or spec.origin is None:
        return {}
    root = Path(spec.origin).resolve().parents[2]  # <clone>/core/hookrun/__init__.py
    return {
        path.name.removeprefix("hookrun-").replace("-", "_"): path
        for path in sorted((root / folder).glob("hookrun-*"))
        if (path / "pyproject.toml").is_file()
    }


def unknown_plugin_message(name: str, where: str, known: Iterable[object]) -> str:
    """The one-line error for a plugin name nobody installed: hookrun's own plugin with the
    install of its folder, else the closest installed name, else where the installed names
    are listed (no install is guessed: a name nobody installed is no package's name)."""
    if name in clone_folders("plugins"):
        return f"{where}: plugin {name!r} is not installed; {install_from_clone('plugins', name)}"
    hint = did_you_mean(name, known) or "; `hookrun plugins list` shows the installed plugins"
    return f"{where}: unknown plugin {name!r}{hint}"

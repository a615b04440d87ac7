"""What installed plugins and hook points look like once imported: the data behind
``hookrun plugins list --load``, ``plugins show`` and ``hookrun hooks`` (the CLI only prints).

Import errors of third-party plugins are reported in the result, never raised.
"""

from __future__ import annotations

import inspect
from typing import Any

import pluggy

from hookrun.hooks import specs as hookspecs
from hookrun.hooks.discovery import EntryPointInfo, installed_plugins
from hookrun.hooks.dispatch import hook_arguments, hook_points
from hookrun.hooks.manager import HookRegistry, register
from hookrun.hooks.plugin import parse_priority


def describe_plugin(
    name: str, found: dict[str, EntryPointInfo], blocked: set[str]
) -> dict[str, Any]:
    """Import plugin ``name`` and describe it: priority, default state, the hook points it
    implements, and a status (``ok``, ``error`` with the reason, or blocked)."""
    info: dict[str, Any] = {
        "priority": None,
        "enabled_by_default": None,
        "hooks": [],
        "status": "ok",
        "error": None,
    }
    if name in blocked:
        info["status"] = "blocked by HOOKRUN_DISABLE_PLUGINS"
        return info
    try:
        cls = found[name].entry_point.load()
        instance = cls(cls.Settings())
    except Exception as exc:  # a broken third-party package: report it, keep listing
        info["status"] = "error"
        info["error"] = f"failed to import: {type(exc).__name__}: {exc}"
        return info
    problems, implemented = _hookimpls(name, instance)
    info["priority"] = parse_priority(cls.priority, f"plugin {name!r}")
    info["enabled_by_default"] = bool(cls.enabled_by_default)
    info["hooks"] = [hook for hook in hook_points() if hook in implemented]
    if problems:
        info["status"] = "error"
        info["error"] = "; ".join(problems)
    return info


def _hookimpls(name: str, instance: object) -> tuple[list[str], set[str]]:
    """Problems of the plugin's hook implementations (as a run would find them), and the
    hook points they serve."""
    pm = pluggy.PluginManager("hookrun")
    pm.add_hookspecs(hookspecs)
    problems = register(pm, name, instance)
    implemented = set()
    for attr in dir(instance):
        opts: dict[str, Any] | None = (
            None if attr.startswith("__") else pm.parse_hookimpl_opts(instance, attr)  # type: ignore[assignment]
        )
        if opts is not None:
            implemented.add(opts.get("specname") or attr)
    return problems, implemented


def call_order(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each hook point with the usable plugins of ``rows`` (``describe_plugin`` results with
    ``name``, in installed order) serving it, ``name (priority)``, in the order a run with
    all of them enabled and their default settings calls them: the run's own
    :class:`~hookrun.hooks.manager.HookRegistry` computes it."""
    found = installed_plugins()
    selected: list[tuple[str, object]] = []
    for row in rows:
        if row["status"] == "ok":
            cls = found[row["name"]].entry_point.load()
            selected.append((row["name"], cls(cls.Settings())))
    priorities = {row["name"]: row["priority"] for row in rows if row["status"] == "ok"}
    registry = HookRegistry(selected, priorities)
    return [
        (hook, [f"{name} ({priorities[name]})" for name in names])
        for hook, names in registry.table()
        if names
    ]


def hook_entries() -> list[dict[str, Any]]:
    """Every hook point with its argument names and cleaned-up docstring."""
    return [
        {
            "name": name,
            "arguments": hook_arguments(name),
            "doc": inspect.cleandoc(getattr(hookspecs, name).__doc__ or ""),
        }
        for name in hook_points()
    ]

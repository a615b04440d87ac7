"""Select, load, validate and order plugins and ad-hoc hooks, and build their callers.

pluggy validates implementations against the hookspecs; the order (priorities, then
registration order) and the calls are hookrun's: :mod:`hookrun.hooks.dispatch`.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pluggy
from pydantic import ValidationError

from hookrun.config.arguments import MAX_INT
from hookrun.errors import PluginError, validation_lines
from hookrun.hooks import specs as hookspecs
from hookrun.hooks.discovery import (
    PLUGIN_GROUP,
    EntryPointInfo,
    autoload_enabled,
    blocked_plugins,
    clash_message,
    clone_folders,
    did_you_mean,
    scan,
    unknown_plugin_message,
)
from hookrun.hooks.dispatch import (
    ON_EXCEPTION,
    HookCaller,
    Hooks,
    Impl,
    hook_arguments,
    hook_points,
)
from hookrun.hooks.plugin import Plugin, Priority, parse_priority
from hookrun.hooks.stats import HookStats


class HookRegistry:
    """Plugins and hooks registered with pluggy, and the one place their call order is
    computed: a run's dispatch, its ``-v`` hook table and ``hookrun plugins list --load``
    all read it, so what is listed is what is called.

    The order at each hook point: the owner's priority (lower first); within one priority
    ``tryfirst`` implementations, then plain ones, then ``trylast`` ones; then the order of
    ``selected`` (installed plugins by name, then ad-hoc hooks as given).
    """

    def __init__(
        self,
        selected: Iterable[tuple[str, object]],
        priorities: Mapping[str, int],
        errors: Iterable[str] = (),
    ) -> None:
        """Register ``selected``; every problem (``errors`` found before, then each object's
        hook implementations) is raised together as one PluginError."""
        selected = list(selected)
        self.pm = pluggy.PluginManager("hookrun")
        self.pm.add_hookspecs(hookspecs)
        errors = [
            *errors,
            *(line for name, obj in selected for line in register(self.pm, name, obj)),
        ]
        if errors:
            raise PluginError(errors)
        ordered = sorted(selected, key=lambda item: priorities[item[0]])
        self.ordered: list[tuple[str, object]] = ordered
        self.plugins: dict[str, object] = dict(ordered)
        self.priorities: dict[str, int] = dict(priorities)  # parsed: "HIGH" as its int
        self.rank = {name: (priorities[name], i) for i, (name, _) in enumerate(ordered)}
        self.unused: dict[str, Collection[str]] = {}  # plugin name -> hook points left idle
        self.stats = HookStats()
        self.hooks = Hooks({name: self._caller(name) for name in hook_points()})

    def drop_unused(self, runner: object) -> None:
        """Stop calling the hook points each plugin's ``unused_hooks(runner)`` names (a call
        costs about a microsecond: a few percent of a small model's step)."""
        for name, obj in self.ordered:
            ask = getattr(obj, "unused_hooks", None)
            if callable(ask):
                self.unused[name] = set(ask(runner))
        for hook in {hook for hooks in self.unused.values() for hook in hooks}:
            setattr(self.hooks, hook, self._caller(hook))

    def _caller(self, hook: str) -> HookCaller:
        """Order one hook point by priority, then tryfirst/trylast, then registration."""
        pluggy_caller = getattr(self.pm.hook, hook)
        rank = self.rank

        def key(impl: pluggy.HookImpl) -> tuple[int, int, int]:
            priority, index = rank[impl.plugin_name]
            return priority, 0 if impl.tryfirst else 2 if impl.trylast else 1, index

        found = sorted(
            (
                i
                for i in pluggy_caller.get_hookimpls()
                if hook not in self.unused.get(i.plugin_name, ())
            ),
            key=key,
        )
        # arguments with a default (pluggy's kwargnames) are passed too, unlike pluggy
        bound = [(i, Impl.of(i.function, i.argnames + i.kwargnames, i.plugin_name)) for i in found]
        spec = pluggy_caller.spec
        return HookCaller(
            hook,
            self.stats,
            [impl for i, impl in bound if not i.wrapper],
            [impl for i, impl in bound if i.wrapper],
            firstresult=bool(spec and spec.opts.get("firstresult")),
            guarded=hook == ON_EXCEPTION,
            chained=getattr(getattr(hookspecs, hook, None), "hookrun_chained", None),
        )

    def table(self) -> list[tuple[str, list[str]]]:
        """Each hook point with the plugins serving it, in call order (wrappers first,
        outermost first): read from the callers dispatch uses."""
        rows = []
        for hook in hook_points():
            caller: HookCaller = getattr(self.hooks, hook)
            rows.append((hook, [impl.owner for impl in (*caller.wrappers, *caller.impls)]))
        return rows

    def stateful(self) -> dict[str, object]:
        """Active plugins and hooks that keep state in checkpoints."""
        return {
            name: obj
            for name, obj in self.ordered
            if callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        }


class PluginManager(HookRegistry):
    """The active plugins and hooks of one runner: installed plugins selected by the config
    (entry points loaded, guarded), ad-hoc hooks named, all validated at construction."""

    def __init__(
        self,
        plugins: Mapping[str, Any] | None = None,
        hooks: Iterable[object] = (),
        *,
        where: str = "plugins",
    ) -> None:
        self.where = where
        self.installed: dict[str, EntryPointInfo]
        self.installed, self.clashes = scan(PLUGIN_GROUP)
        self.load_errors: dict[str, str] = {}
        self.notices: list[str] = []
        chosen = self._select(dict(plugins or {}))
        priorities = {name: int(plugin.priority) for name, plugin in chosen}
        selected: list[tuple[str, object]] = list(chosen)
        errors: list[str] = []
        for obj in hooks:
            name = self._hook_name(obj, selected)
            selected.append((name, obj))
            where = f"hook {type(obj).__name__} ({name!r})"
            try:
                priorities[name] = parse_priority(getattr(obj, "priority", Priority.NORMAL), where)
            except ValueError as exc:
                errors.append(str(exc))
        super().__init__(selected, priorities, errors)

    def report_interval(self) -> tuple[str, int] | None:
        """The interval a plugin's settings give its reports (the setting its class names in
        ``report_interval_setting``, set explicitly to a number), with the setting's path:
        ``runner.log_interval`` defaults to it. None when no plugin sets one."""
        for name, plugin in self.plugins.items():
            setting = getattr(plugin, "report_interval_setting", None)
            if not isinstance(plugin, Plugin) or not setting:
                continue
            value = getattr(plugin.settings, setting, None)
            if setting in plugin.settings.model_fields_set and isinstance(value, int):
                return f"{self.where}.{name}.{setting}", value
        return None

    def _select(self, config: dict[str, Any]) -> list[tuple[str, Plugin]]:
        errors: list[str] = []
        for name, value in config.items():
            if name not in self.installed:
                if value is False and name in clone_folders("plugins"):
                    continue  # one config for environments with and without it: nothing to do
                errors.append(unknown_plugin_message(name, f"{self.where}.{name}", self.installed))
            elif not (value is None or isinstance(value, (bool, Mapping))):
                errors.append(
                    f"{self.where}.{name}: expected a mapping of settings, true or false "
                    f"(got {value!r})"
                )
        blocked = blocked_plugins()
        autoload = autoload_enabled()
        clashing = self.clashes
        selected: list[tuple[str, Plugin]] = []
        for name, info in self.installed.items():
            value = config.get(name)
            asked = name in config and value is not False
            if name in blocked:
                if asked:
                    self.notices.append(f"plugin {name!r} is blocked by HOOKRUN_DISABLE_PLUGINS")
                continue
            if value is False or (not asked and not autoload):
                continue
            if name in clashing:  # which one would run is an accident of the install order
                errors.append(
                    f"{self.where}.{name}: {clash_message('plugin', name, clashing[name])}"
                )
                continue
            cls = self._load(name, info, asked, errors)
            if cls is None or (not asked and not cls.enabled_by_default):
                continue
            instance = self._instantiate(name, cls, value, errors)
            if instance is not None:
                selected.append((name, instance))
        if errors:
            raise PluginError(errors)
        return selected

    def _load(
        self, name: str, info: EntryPointInfo, asked: bool, errors: list[str]
    ) -> type[Plugin] | None:
        try:
            cls = info.entry_point.load()
        except Exception as exc:  # any import-time failure of a third-party package
            message = (
                f"plugin {name!r} from distribution '{info.distribution} {info.version}' "
                f"failed to import: {type(exc).__name__}: {exc}"
            )
            if asked:
                errors.append(f"{self.where}.{name}: {message}")
            else:
                self.load_errors[name] = message
                self.notices.append(message + " (skipped)")
            return None
        if not (isinstance(cls, type) and hasattr(cls, "Settings")):
            message = f"plugin {name!r} entry point {info.value!r} is not a hookrun Plugin class"
            (errors.append if asked else self.notices.append)(f"{self.where}.{name}: {message}")
            return None
        return cls

    def _instantiate(
        self, name: str, cls: type[Plugin], value: Any, errors: list[str]
    ) -> Plugin | None:
        settings = dict(value) if isinstance(value, Mapping) else {}
        if "priority" in settings:
            raw, where = settings.pop("priority"), f"{self.where}.{name}.priority"
        else:
            raw, where = cls.priority, f"plugin {cls.__name__} ({name!r})"
        try:
            priority = parse_priority(raw, where)
        except ValueError as exc:
            errors.append(str(exc))
            return None
        try:
            parsed = cls.Settings.model_validate(settings)
        except ValidationError as exc:
            errors.extend(validation_lines(exc, f"{self.where}.{name}", cls.Settings.model_fields))
            return None
        too_large = [
            f"{self.where}.{name}.{key}: {value} is beyond the 64-bit integers torch and "
            f"Python's C code take (at most {MAX_INT})"
            for key, value in parsed.model_dump().items()
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT
        ]
        if too_large:
            errors.extend(too_large)
            return None
        instance = cls(parsed)
        instance.priority = priority
        return instance

    def _hook_name(self, obj: object, taken: list[tuple[str, object]]) -> str:
        base = getattr(obj, "name", None) or type(obj).__name__
        names = {name for name, _ in taken} | set(self.installed)
        name, n = str(base), 2
        while name in names:
            name, n = f"{base}#{n}", n + 1
        return name


def register(pm: pluggy.PluginManager, name: str, obj: object) -> list[str]:
    """Register ``obj`` with pluggy under ``name``; its problems as lines, hookrun's checks
    first (:func:`check_hookimpls`), then what pluggy's own validation refuses (a wrapper
    that is not a generator, ...), worded as one line."""
    errors = check_hookimpls(pm, name, obj)
    if not errors:
        try:
            pm.register(obj, name=name)
        except pluggy.PluginValidationError as exc:
            lines = str(exc).splitlines()[1:]  # the first names the plugin, as owner does
            errors.append(f"{type(obj).__name__} ({name!r}): {'; '.join(lines)}")
    return errors


def check_hookimpls(pm: pluggy.PluginManager, name: str, obj: object) -> list[str]:
    """What pluggy does not check, or checks only one at a time and over several lines: a
    method named like a hook point without ``@hookimpl`` (never runs), an ``@hookimpl``
    naming no hook point (pluggy's ``check_pending``, without did-you-mean), an old-style
    ``hookwrapper`` (hookrun's dispatch has wrappers only), and arguments a hook point does
    not pass, defaulted ones included (hookrun passes them; pluggy neither passes nor checks
    them)."""
    points = set(hook_points())
    errors = []
    owner = f"{type(obj).__name__} ({name!r})"
    for attr in dir(obj):
        if attr.startswith("__"):
            continue
        try:
            method = getattr(obj, attr)
        except Exception:  # properties may raise before setup
            continue
        opts = pm.parse_hookimpl_opts(obj, attr)
        if opts is None:
            if attr in points and callable(method):
                errors.append(f"{owner}: method {attr!r} matches a hook point but lacks @hookimpl")
            continue
        point = opts.get("specname") or attr
        if opts.get("hookwrapper"):
            errors.append(
                f"{owner}: method {attr!r} at hook point {point!r} is an old-style "
                "hookwrapper=True, which hookrun does not support: use wrapper=True"
            )
            continue
        if point not in points:
            errors.append(
                f"{owner}: method {attr!r} is marked @hookimpl but no hook point is named "
                f"{point!r}{did_you_mean(point, points)}"
            )
            continue
        wanted = [p for p in inspect.signature(method).parameters if p != "self"]
        allowed = hook_arguments(point)
        for arg in wanted:
            if arg not in allowed:
                errors.append(
                    f"{owner}: method {attr!r} takes argument {arg!r} that hook point "
                    f"{point!r} does not pass{did_you_mean(arg, allowed)} "
                    f"(it passes: {', '.join(allowed)})"
                )
    return errors

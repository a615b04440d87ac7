"""Select, load, validate, order and call plugins and ad-hoc hooks.

pluggy validates implementations against the hookspecs and calls wrappers; the order is
ours: numeric priority, ties in registration order (installed plugins by name, then
user hooks as given). Calls go through pre-bound lists so a hook point costs well under
a microsecond per implementation.
"""

from __future__ import annotations

import inspect
import operator
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import pluggy
from pydantic import ValidationError

from hookrun import hookspecs
from hookrun.discovery import (
    EntryPointInfo,
    autoload_enabled,
    blocked_plugins,
    did_you_mean,
    installed_plugins,
    unknown_plugin_message,
)
from hookrun.errors import PluginError, validation_lines
from hookrun.plugin import Plugin, Priority, parse_priority


def hook_points() -> list[str]:
    """Every hook point's name, in the order they are declared (and documented)."""
    specs = [f for _, f in inspect.getmembers(hookspecs, inspect.isfunction)]
    specs = [f for f in specs if hasattr(f, "hookrun_spec")]
    return [f.__name__ for f in sorted(specs, key=lambda f: f.__code__.co_firstlineno)]


def hook_arguments(name: str) -> list[str]:
    """The argument names a hook point passes (``runner`` first)."""
    return list(inspect.signature(getattr(hookspecs, name)).parameters)


class Impl(NamedTuple):
    """One implementation of a hook point, called with the arguments it names, positionally:
    picking them with an ``itemgetter`` costs a third of building a keyword dict per call."""

    function: Callable[..., Any]
    argnames: tuple[str, ...]
    owner: str
    pick: Callable[[dict[str, Any]], Any] | None  # None when it takes no argument

    @classmethod
    def of(cls, function: Callable[..., Any], argnames: Iterable[str], owner: str) -> Impl:
        names = tuple(argnames)
        return cls(function, names, owner, operator.itemgetter(*names) if names else None)

    def call(self, kwargs: dict[str, Any]) -> Any:
        pick = self.pick
        if pick is None:
            return self.function()
        if len(self.argnames) == 1:
            return self.function(pick(kwargs))
        return self.function(*pick(kwargs))


class HookCaller:
    """Calls one hook point's implementations in priority order and times them."""

    __slots__ = ("name", "impls", "fallback", "stats")

    def __init__(self, name: str, stats: HookStats) -> None:
        self.name = name
        self.impls: list[Impl] = []
        self.fallback: Callable[..., Any] | None = None
        self.stats = stats

    def __call__(self, **kwargs: Any) -> list[Any]:
        """The results that are not None. The time the call took goes to ``stats.total``: set,
        not added, so that hook calls nested inside it are not counted twice."""
        impls = self.impls
        if not impls and self.fallback is None:
            return []
        stats = self.stats
        total, start = stats.total, time.perf_counter()
        if self.fallback is not None:
            results = list(self.fallback(**kwargs) or ())
        elif stats.profile:
            results = self._call_profiled(kwargs)
        else:
            results = []
            for impl in impls:
                result = impl.call(kwargs)
                if result is not None:
                    results.append(result)
        stats.total = total + (time.perf_counter() - start)
        return results

    def _call_profiled(self, kwargs: dict[str, Any]) -> list[Any]:
        results = []
        for impl in self.impls:
            start = time.perf_counter()
            result = impl.call(kwargs)
            self.stats.record(impl.owner, self.name, time.perf_counter() - start)
            if result is not None:
                results.append(result)
        return results


class HookStats:
    """Time spent inside hook calls: a total always, per plugin and hook when profiling."""

    def __init__(self) -> None:
        self.total = 0.0
        self.profile = False
        self.per_hook: dict[tuple[str, str], list[float]] = {}

    def record(self, owner: str, hook: str, seconds: float) -> None:
        entry = self.per_hook.get((owner, hook))
        if entry is None:
            entry = self.per_hook[(owner, hook)] = [0, 0.0]
        entry[0] += 1
        entry[1] += seconds


class Hooks:
    """Attribute access to every hook point's caller: ``hooks.after_train_iter(...)``."""

    def __init__(self, callers: dict[str, HookCaller]) -> None:
        self.__dict__.update(callers)

    def __getattr__(self, name: str) -> HookCaller:  # only reached for unknown names
        raise AttributeError(f"no hook point named {name!r}{did_you_mean(name, hook_points())}")


class PluginManager:
    """The active plugins and hooks of one runner, loaded and validated at construction."""

    def __init__(
        self,
        plugins: Mapping[str, Any] | None = None,
        hooks: Iterable[object] = (),
        *,
        where: str = "plugins",
    ) -> None:
        self.pm = pluggy.PluginManager("hookrun")
        self.pm.add_hookspecs(hookspecs)
        self.where = where
        self.installed: dict[str, EntryPointInfo] = installed_plugins()
        self.load_errors: dict[str, str] = {}
        self.notices: list[str] = []
        self.stats = HookStats()
        selected = self._select(dict(plugins or {}))
        for obj in hooks:
            selected.append((self._hook_name(obj, selected), obj))
        errors = [line for name, obj in selected for line in check_hookimpls(self.pm, name, obj)]
        if errors:
            raise PluginError(errors)
        ordered = sorted(selected, key=lambda item: _priority(item[1]))
        for name, obj in reversed(ordered):  # pluggy calls the last registered first
            self.pm.register(obj, name=name)
        self.ordered: list[tuple[str, object]] = ordered
        self.plugins: dict[str, object] = dict(ordered)
        self.hooks = Hooks({name: self._caller(name) for name in hook_points()})

    def _select(self, config: dict[str, Any]) -> list[tuple[str, object]]:
        errors: list[str] = []
        for name, value in config.items():
            if name not in self.installed:
                errors.append(unknown_plugin_message(name, f"{self.where}.{name}", self.installed))
            elif not (value is None or isinstance(value, (bool, Mapping))):
                errors.append(
                    f"{self.where}.{name}: expected a mapping of settings, true or false "
                    f"(got {value!r})"
                )
        blocked = blocked_plugins()
        autoload = autoload_enabled()
        selected: list[tuple[str, object]] = []
        for name, info in self.installed.items():
            value = config.get(name)
            asked = name in config and value is not False
            if name in blocked:
                if asked:
                    self.notices.append(f"plugin {name!r} is blocked by HOOKRUN_DISABLE_PLUGINS")
                continue
            if value is False or (not asked and not autoload):
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
        priority = cls.priority
        if "priority" in settings:
            try:
                priority = parse_priority(settings.pop("priority"), f"{self.where}.{name}.priority")
            except ValueError as exc:
                errors.append(str(exc))
                return None
        try:
            parsed = cls.Settings.model_validate(settings)
        except ValidationError as exc:
            errors.extend(validation_lines(exc, f"{self.where}.{name}", cls.Settings.model_fields))
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

    def _caller(self, hook: str) -> HookCaller:
        caller = HookCaller(hook, self.stats)
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        if any(impl.hookwrapper or impl.wrapper for impl in impls):
            caller.fallback = getattr(self.pm.hook, hook)
        for impl in reversed(impls):
            if impl.hookwrapper or impl.wrapper:
                continue
            caller.impls.append(Impl.of(impl.function, impl.argnames, impl.plugin_name))
        return caller

    def table(self) -> list[tuple[str, list[str]]]:
        """Each hook point with the plugins serving it, in call order."""
        return [
            (hook, [impl.owner for impl in getattr(self.hooks, hook).impls])
            for hook in hook_points()
        ]

    def stateful(self) -> dict[str, object]:
        """Active plugins and hooks that keep state in checkpoints."""
        return {
            name: obj
            for name, obj in self.ordered
            if callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        }


def _priority(obj: object) -> int:
    value = getattr(obj, "priority", Priority.NORMAL)
    return int(value) if isinstance(value, int) else int(Priority.NORMAL)


def check_hookimpls(pm: pluggy.PluginManager, name: str, obj: object) -> list[str]:
    """Errors for methods that would silently never run or fail when called."""
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

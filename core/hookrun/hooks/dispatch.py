"""The one dispatcher of every hook point (``runner.hooks.<point>(**kwargs)``), with
pluggy's semantics and hookrun's order:

- **Order**: the owner's priority (lower first); within one priority an implementation
  marked ``tryfirst`` runs before the others and one marked ``trylast`` after them; then
  registration order (installed plugins by name, then user hooks as given). A priority is
  a ``Priority``, its name in any case (``"HIGHEST"``, ``"high"``) or an int 0-100; anything
  else is a PluginError naming the plugin or hook before any training.
- **Plain implementations** run in that order; the call returns their non-None results as
  a list, or, where the hookspec says ``firstresult=True``, stops at the first non-None
  result and returns it (None when there is none).
- **Wrappers** (``@hookimpl(wrapper=True)``, a generator that yields once) wrap all plain
  implementations: the code before ``yield`` runs first, ``yield`` gives the inner result
  (or raises the inner exception), and what the wrapper returns (or raises) is the result
  (or exception) the next wrapper out sees and the caller gets. Wrappers nest in the same
  order: the highest priority is outermost. A wrapper returning None leaves ``[]`` at a
  list hook point. Old-style ``hookwrapper=True`` is refused: use ``wrapper=True``.
- **Chained points** (``transform_batch``): each non-None result replaces the argument the
  spec names for the next implementation, and the call returns its last value.
- **Errors**: an exception propagates unchanged through the wrappers to the caller, except
  at ``on_exception``: there every implementation runs even when one fails, each failure
  (a wrapper's too) is one stderr line ``[hookrun] on_exception of <owner> failed:
  <repr>``, and the call never raises, so it never hides the exception being reported.
- **Cost**: a hook point with plain implementations only calls a pre-bound list whose
  arguments are picked with an ``itemgetter``, well under a microsecond per implementation;
  ``HookStats`` times every call, and each implementation when profiling.
"""

from __future__ import annotations

import inspect
import operator
import sys
import time
from collections.abc import Callable, Iterable
from types import GeneratorType
from typing import Any, NamedTuple

from hookrun.hooks import specs as hookspecs
from hookrun.hooks.discovery import did_you_mean
from hookrun.hooks.stats import HookStats

ON_EXCEPTION = "on_exception"
_FAILED = object()  # what a failed step at on_exception returns instead of raising


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
    """Calls one hook point's implementations in order, inside its wrappers, and times them."""

    __slots__ = (
        "name",
        "impls",
        "calls",
        "wrappers",
        "stats",
        "firstresult",
        "guarded",
        "chained",
        "direct",
    )

    def __init__(
        self,
        name: str,
        stats: HookStats,
        impls: Iterable[Impl] = (),
        wrappers: Iterable[Impl] = (),
        *,
        firstresult: bool = False,
        guarded: bool = False,
        chained: str | None = None,
    ) -> None:
        self.name = name
        self.impls = tuple(impls)  # plain implementations, in call order
        # what the lean loop needs of each, unpacked: no Python frame between the hook
        # point and the implementation (each one costs about a microsecond after torch ops)
        self.calls = tuple((i.function, i.pick, len(i.argnames) > 1) for i in self.impls)
        self.wrappers = tuple(wrappers)  # outermost first
        self.stats = stats
        self.firstresult = firstresult
        self.guarded = guarded  # the on_exception policy: report failures, never raise
        self.chained = chained  # the argument each result replaces
        self.direct = not (self.wrappers or firstresult or guarded or chained)

    @property
    def used(self) -> bool:
        """Whether anything implements this hook point: callers on the hot path skip the
        call (and its keyword arguments) when nothing would run."""
        return bool(self.impls or self.wrappers)

    def __call__(self, **kwargs: Any) -> Any:
        """The results that are not None (see the module docstring for wrappers and
        firstresult). The time the call took goes to ``stats.total``: set, not added, so
        that hook calls nested inside it are not counted twice."""
        impls = self.impls
        if not impls and self.direct:
            return []
        stats = self.stats
        if not self.direct or stats.profile:
            return self._call_full(kwargs)
        total, start = stats.total, time.perf_counter()
        results = []
        for function, pick, many in self.calls:
            if pick is None:
                result = function()
            elif many:
                result = function(*pick(kwargs))
            else:
                result = function(pick(kwargs))
            if result is not None:
                results.append(result)
        stats.total = total + (time.perf_counter() - start)
        return results

    def _call_full(self, kwargs: dict[str, Any]) -> Any:
        stats = self.stats
        total, start = stats.total, time.perf_counter()
        try:
            return self._multicall(kwargs)
        finally:
            stats.total = total + (time.perf_counter() - start)

    def _multicall(self, kwargs: dict[str, Any]) -> Any:
        """pluggy's ``_multicall`` over our order; each call goes through ``_step`` only when
        profiling or at on_exception."""
        careful = self.guarded or self.stats.profile
        step = self._step
        teardowns: list[tuple[Impl, GeneratorType[Any, Any, Any]]] = []
        results: list[Any] = []
        exception: BaseException | None = None
        try:
            for impl in self.wrappers:
                gen = impl.call(kwargs)
                if not careful:
                    _begin(gen)
                elif step(impl, _begin, gen) is _FAILED:
                    continue
                teardowns.append((impl, gen))
            chained = self.chained
            for impl in self.impls:
                result = step(impl, impl.call, kwargs) if careful else impl.call(kwargs)
                if result is not None and result is not _FAILED:
                    if chained is not None:
                        kwargs = {**kwargs, chained: result}
                        continue
                    results.append(result)
                    if self.firstresult:
                        break
        except BaseException as exc:
            exception = exc
        if self.chained is not None:
            outcome = kwargs[self.chained]
        else:
            outcome = (results[0] if results else None) if self.firstresult else results
        for impl, gen in reversed(teardowns):
            try:
                if careful:
                    finished = step(impl, _finish, gen, outcome, exception, calls=0)
                else:
                    finished = _finish(gen, outcome, exception)
            except BaseException as exc:
                exception = exc
            else:
                if finished is not _FAILED:
                    outcome, exception = finished, None
        if exception is not None:
            raise exception
        return [] if outcome is None and not self.firstresult else outcome

    def _step(self, impl: Impl, function: Callable[..., Any], *args: Any, calls: int = 1) -> Any:
        """One call into an implementation, timed when profiling. At on_exception a failure is
        reported and ``_FAILED`` returned, so the other implementations still run."""
        start = time.perf_counter()
        try:
            return function(*args)
        except Exception as exc:
            if not self.guarded:
                raise
            print(f"[hookrun] {self.name} of {impl.owner} failed: {exc!r}", file=sys.stderr)
            return _FAILED
        finally:
            if self.stats.profile:
                self.stats.record(impl.owner, self.name, time.perf_counter() - start, calls)


def _begin(gen: GeneratorType[Any, Any, Any]) -> None:
    """Run a wrapper up to its ``yield``."""
    try:
        next(gen)
    except StopIteration:
        raise RuntimeError(f"hook wrapper {gen.__qualname__} did not yield") from None


def _finish(
    gen: GeneratorType[Any, Any, Any], outcome: Any, exception: BaseException | None
) -> Any:
    """Resume a wrapper with the inner outcome; what it returns is the new result."""
    try:
        if exception is None:
            gen.send(outcome)
        else:
            gen.throw(exception)
    except StopIteration as stop:
        return stop.value
    gen.close()
    raise RuntimeError(f"hook wrapper {gen.__qualname__} has a second yield")


class Hooks:
    """Attribute access to every hook point's caller: ``hooks.after_train_iter(...)``."""

    def __init__(self, callers: dict[str, HookCaller]) -> None:
        self.__dict__.update(callers)

    def __getattr__(self, name: str) -> HookCaller:  # only reached for unknown names
        raise AttributeError(f"no hook point named {name!r}{did_you_mean(name, hook_points())}")

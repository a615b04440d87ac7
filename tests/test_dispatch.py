"""The one hook dispatcher: wrappers, the on_exception policy, priorities and firstresult."""

from __future__ import annotations

import importlib
import sys

import pytest

from _support import Tagged
from hookrun import Priority, Runner, hookimpl
from hookrun.errors import PluginError
from hookrun.hooks.dispatch import HookCaller, Impl
from hookrun.hooks.manager import PluginManager
from hookrun.hooks.stats import HookStats
from hookrun.testing import toy_runner_kwargs


class Wrap:
    """A new-style wrapper of after_train_iter that records what it sees and adds its tag."""

    def __init__(self, tag, log, priority):
        self.name = tag
        self.log = log
        self.priority = priority

    @hookimpl(wrapper=True)
    def after_train_iter(self, batch_idx):
        self.log.append(f"{self.name}-in")
        try:
            result = yield
        except ValueError as exc:
            self.log.append(f"{self.name} saw {exc}")
            raise
        self.log.append(f"{self.name}-out {result}")
        return [*result, self.name]


def test_wrappers_run_around_the_plain_implementations_in_priority_order(tmp_path):
    log: list[str] = []
    hooks = [
        Tagged("late", log, Priority.LOW),
        Wrap("inner", log, Priority.VERY_LOW),
        Tagged("early", log, Priority.HIGHEST),
        Wrap("outer", log, Priority.HIGH),
    ]
    Runner(**toy_runner_kwargs(tmp_path, hooks=hooks, max_epochs=1)).train()
    one_iter = [
        "outer-in",
        "inner-in",
        "early",
        "late",
        "inner-out ['early', 'late']",
        "outer-out ['early', 'late', 'inner']",
    ]
    assert log == ["early", "late"] + one_iter * 3  # before_train, then three iterations


def test_the_outermost_wrapper_gives_the_result():
    manager = PluginManager({}, [Tagged("a", []), Wrap("w", [], 90)])
    assert manager.hooks.after_train_iter(runner=None, batch_idx=0, batch=None, outputs={}) == [
        "a",
        "w",
    ]


def test_an_argument_with_a_default_still_receives_the_value(tmp_path):
    seen: list[int] = []

    class Defaulted:
        @hookimpl
        def after_train_iter(self, batch_idx=-1):
            seen.append(batch_idx)

    Runner(**toy_runner_kwargs(tmp_path, hooks=[Defaulted()], max_epochs=1)).train()
    assert seen == [0, 1, 2]


def test_a_wrapper_sees_an_exception_raised_inside_and_training_gets_it(tmp_path):
    log: list[str] = []
    boom = ValueError("bad batch")

    class Fails:
        @hookimpl
        def after_train_iter(self, batch_idx):
            if batch_idx == 1:
                raise boom

    hooks = [Wrap("outer", log, 10), Wrap("inner", log, 20), Fails()]
    with pytest.raises(ValueError) as raised:
        Runner(**toy_runner_kwargs(tmp_path, hooks=hooks, max_epochs=1)).train()
    assert raised.value is boom
    assert log[-4:] == ["outer-in", "inner-in", "inner saw bad batch", "outer saw bad batch"]


def test_a_wrapper_may_turn_an_exception_into_a_result():
    class Fails:
        @hookimpl
        def before_train(self):
            raise KeyError("lost")

    class Rescue:
        @hookimpl(wrapper=True)
        def before_train(self):
            try:
                yield
            except KeyError:
                return ["rescued"]

    assert PluginManager({}, [Rescue(), Fails()]).hooks.before_train(runner=None) == ["rescued"]


def test_a_wrapper_on_exception_runs_when_training_raises(tmp_path):
    log: list[object] = []
    boom = RuntimeError("diverged")

    class Fails:
        @hookimpl
        def before_train_epoch(self):
            raise boom

    class Watch:
        @hookimpl(wrapper=True)
        def on_exception(self, exception):
            log.append(("in", exception))
            result = yield
            log.append(("out", result))
            return result

    class Note:
        @hookimpl
        def on_exception(self, exception):
            log.append("note")

    with pytest.raises(RuntimeError) as raised:
        Runner(**toy_runner_kwargs(tmp_path, hooks=[Fails(), Note(), Watch()])).train()
    assert raised.value is boom
    assert log == [("in", boom), "note", ("out", [])]


def test_a_failing_on_exception_hook_stops_neither_the_others_nor_the_exception(tmp_path, capsys):
    seen: list[str] = []
    boom = RuntimeError("diverged")

    class Fails:
        @hookimpl
        def before_train(self):
            raise boom

    def on_exception_hook(tag, broken=False):
        class Hook:
            name = tag

            @hookimpl
            def on_exception(self, exception):
                seen.append(tag)
                if broken:
                    raise OSError("disk full")

        return Hook()

    hooks = [Fails(), on_exception_hook("first"), on_exception_hook("broken", True)]
    hooks.append(on_exception_hook("last"))
    with pytest.raises(RuntimeError) as raised:
        Runner(**toy_runner_kwargs(tmp_path, hooks=hooks)).train()
    assert raised.value is boom
    assert seen == ["first", "broken", "last"]
    err = capsys.readouterr().err
    assert "broken" in err and "failed: OSError('disk full')" in err


def test_on_exception_failures_are_one_stderr_line_each_and_never_raise(capsys):
    class Broken:
        @hookimpl
        def on_exception(self):
            raise OSError("disk full")

    class BrokenWrapper:
        @hookimpl(wrapper=True)
        def on_exception(self):
            yield
            raise ValueError("after yield")

    manager = PluginManager({}, [BrokenWrapper(), Broken()])
    assert manager.hooks.on_exception(runner=None, exception=RuntimeError("x")) == []
    assert capsys.readouterr().err.splitlines() == [
        "[hookrun] on_exception of Broken failed: OSError('disk full')",
        "[hookrun] on_exception of BrokenWrapper failed: ValueError('after yield')",
    ]


def test_other_hook_points_propagate_the_exception_unchanged():
    boom = OSError("disk full")

    class Broken:
        @hookimpl
        def after_train(self):
            raise boom

    with pytest.raises(OSError) as raised:
        PluginManager({}, [Broken()]).hooks.after_train(runner=None)
    assert raised.value is boom


NORMAL_PLUGIN = """
from hookrun import Plugin, Priority, hookimpl

CALLS = []

class Normal(Plugin):
    name = "normal"
    priority = {priority}

    @hookimpl
    def before_train(self):
        CALLS.append("normal")
"""


def install_normal(make_dist, priority="Priority.NORMAL", module="dispatch_normal"):
    make_dist(
        "hookrun-normal",
        module,
        NORMAL_PLUGIN.format(priority=priority),
        {"hookrun.plugins": {"normal": f"{module}:Normal"}},
    )
    sys.modules.pop(module, None)
    return importlib.import_module(module)


def test_priority_names_place_ad_hoc_hooks_before_plugins_and_earlier_hooks(make_dist, tmp_path):
    log = install_normal(make_dist).CALLS
    hooks = [Tagged("fifty", log, 50), Tagged("top", log, "HIGHEST"), Tagged("high", log, "high")]
    runner = Runner(**toy_runner_kwargs(tmp_path, plugins={"normal": True}, hooks=hooks))
    runner.hooks.before_train(runner=runner)
    assert log == ["top", "high", "normal", "fifty"]


@pytest.mark.parametrize("bad", [500, -1, "urgent", 3.5, True])
def test_a_bad_ad_hoc_priority_is_an_error_naming_the_hook_before_training(tmp_path, bad):
    hook = Tagged("my-hook", [], bad)
    with pytest.raises(PluginError, match=rf"hook Tagged \('my-hook'\): .*{bad!r}"):
        Runner(**toy_runner_kwargs(tmp_path, hooks=[hook]))
    assert not (tmp_path / "run").exists()


def test_a_bad_plugin_class_priority_is_an_error_naming_the_plugin(make_dist, tmp_path):
    install_normal(make_dist, priority="'soonish'", module="dispatch_bad_priority")
    with pytest.raises(
        PluginError, match=r"plugin Normal \('normal'\): unknown priority 'soonish'"
    ):
        Runner(**toy_runner_kwargs(tmp_path, plugins={"normal": True}))
    assert not (tmp_path / "run").exists()


def test_tryfirst_and_trylast_order_within_one_priority():
    log: list[str] = []

    def hook(tag, priority, **opts):
        class Hook:
            name = tag

            @hookimpl(**opts)
            def before_train(self):
                log.append(tag)

        Hook.priority = priority
        return Hook()

    hooks = [
        hook("last", 50, trylast=True),
        hook("plain", 50),
        hook("first", 50, tryfirst=True),
        hook("high-but-last", 10, trylast=True),
    ]
    PluginManager({}, hooks).hooks.before_train(runner=None)
    assert log == ["high-but-last", "first", "plain", "last"]


def test_old_style_and_non_generator_wrappers_are_refused():
    class OldStyle:
        @hookimpl(hookwrapper=True)
        def before_train(self):
            yield

    class NotAGenerator:
        @hookimpl(wrapper=True)
        def after_train(self):
            return None

    with pytest.raises(PluginError) as raised:
        PluginManager({}, [OldStyle(), NotAGenerator()])
    text = str(raised.value)
    assert "OldStyle ('OldStyle'): method 'before_train'" in text and "use wrapper=True" in text
    # pluggy's own check, worded as one line naming the plugin and the method
    assert "NotAGenerator ('NotAGenerator'): hookimpl definition: after_train()" in text
    assert "not a generator" in text and len(raised.value.lines) == 2


def test_wrappers_are_listed_and_profiled():
    manager = PluginManager({}, [Tagged("a", []), Wrap("w", [], 90)])
    assert dict(manager.table())["after_train_iter"] == ["w", "a"]
    manager.stats.profile = True
    for batch_idx in range(3):
        manager.hooks.after_train_iter(runner=None, batch_idx=batch_idx, batch=None, outputs={})
    assert {key: calls for key, (calls, _) in manager.stats.per_hook.items()} == {
        ("w", "after_train_iter"): 3,
        ("a", "after_train_iter"): 3,
    }
    assert manager.stats.total > 0


def test_firstresult_stops_at_the_first_result():
    calls: list[str] = []

    def answer(tag, value):
        def function():
            calls.append(tag)
            return value

        return Impl.of(function, (), tag)

    impls = [answer("none", None), answer("one", 1), answer("two", 2)]
    caller = HookCaller("pick", HookStats(), impls, firstresult=True)
    assert caller() == 1
    assert calls == ["none", "one"]
    assert HookCaller("pick", HookStats(), [answer("none", None)], firstresult=True)() is None

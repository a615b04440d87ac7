"""Selection, discovery, ordering and validation of plugins and hooks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from _support import Tagged
from hookrun import Plugin, PluginSettings, Priority, Runner, hookimpl
from hookrun.errors import PluginError
from hookrun.hooks.manager import PluginManager
from hookrun.testing import toy_runner_kwargs

PLUGIN_SOURCE = """
from pydantic import Field
from hookrun import Plugin, PluginSettings, Priority, hookimpl

CALLS = []

class Settings(PluginSettings):
    greeting: str = Field("hi", description="What to record.")
    times: int = Field(1, ge=1, description="How often.")

class Greeter(Plugin):
    name = "greeter"
    Settings = Settings
    priority = Priority.LOW
    enabled_by_default = {default}

    @hookimpl
    def before_train(self, runner):
        CALLS.extend([self.settings.greeting] * self.settings.times)
"""


def install_greeter(make_dist, module="greeter_mod", default=True):
    make_dist(
        "hookrun-greeter",
        module,
        PLUGIN_SOURCE.format(default=default),
        {"hookrun.plugins": {"greeter": f"{module}:Greeter"}},
    )
    sys.modules.pop(module, None)


def test_priorities_order_every_hook_point_and_ties_keep_the_given_order(tmp_path):
    log = []
    hooks = [
        Tagged("low", log, Priority.LOW),
        Tagged("first-normal", log),
        Tagged("high", log, Priority.HIGH),
        Tagged("second-normal", log),
        Tagged("highest", log, 0),
    ]
    Runner(**toy_runner_kwargs(tmp_path, hooks=hooks, max_epochs=1)).train()
    order = ["highest", "high", "first-normal", "second-normal", "low"]
    assert log == order * 4  # before_train and three after_train_iter calls


def test_installed_plugin_is_discovered_and_configured_by_name(make_dist, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "1")
    install_greeter(make_dist)
    runner = Runner(
        **toy_runner_kwargs(tmp_path, plugins={"greeter": {"greeting": "yo", "times": 2}})
    )
    runner.train()
    assert sys.modules["greeter_mod"].CALLS == ["yo", "yo"]
    assert runner.plugins["greeter"].priority == Priority.LOW
    info = runner.manager.installed["greeter"]
    assert (info.distribution, info.version) == ("hookrun-greeter", "1.2.3")


def test_enabled_by_default_plugin_runs_without_configuration(make_dist, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "1")
    install_greeter(make_dist)
    Runner(**toy_runner_kwargs(tmp_path)).train()
    assert sys.modules["greeter_mod"].CALLS == ["hi"]


def test_not_enabled_by_default_needs_configuration(make_dist, tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "1")
    install_greeter(make_dist, default=False)
    assert "greeter" not in Runner(**toy_runner_kwargs(tmp_path)).plugins
    assert "greeter" in Runner(**toy_runner_kwargs(tmp_path, plugins={"greeter": True})).plugins


def test_priority_override_from_configuration(make_dist, tmp_path):
    install_greeter(make_dist)
    log = []
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path, plugins={"greeter": {"priority": "HIGHEST"}}, hooks=[Tagged("mine", log, 0)]
        )
    )
    assert [name for name, _ in runner.manager.ordered] == ["greeter", "mine"]
    with pytest.raises(PluginError, match=r"plugins.greeter.priority: unknown priority 'soon'"):
        Runner(**toy_runner_kwargs(tmp_path, plugins={"greeter": {"priority": "soon"}}))


@pytest.mark.parametrize("how", ["false", "env", "autoload"])
def test_disabled_or_blocked_plugin_is_never_imported(make_dist, tmp_path, monkeypatch, how):
    install_greeter(make_dist, module="greeter_blocked")
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0" if how == "autoload" else "1")
    plugins = {"greeter": False} if how == "false" else None
    if how == "env":
        monkeypatch.setenv("HOOKRUN_DISABLE_PLUGINS", "timer, greeter")
    runner = Runner(**toy_runner_kwargs(tmp_path, plugins=plugins))
    assert "greeter" not in runner.plugins
    assert "greeter_blocked" not in sys.modules


def test_plugin_failing_to_import_is_reported_and_skipped_unless_asked(
    make_dist, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "1")
    make_dist(
        "hookrun-broken",
        "broken_mod",
        "raise ImportError('needs libfoo')\n",
        {"hookrun.plugins": {"broken": "broken_mod:Broken"}},
    )
    runner = Runner(**toy_runner_kwargs(tmp_path))
    assert "broken" not in runner.plugins
    message = runner.manager.load_errors["broken"]
    assert "hookrun-broken 1.2.3" in message and "needs libfoo" in message
    assert "needs libfoo" in capsys.readouterr().out
    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, plugins={"broken": True}))
    assert info.value.lines == [
        "plugins.broken: plugin 'broken' from distribution 'hookrun-broken 1.2.3' failed to "
        "import: ImportError: needs libfoo"
    ]


def test_unknown_plugin_gets_did_you_mean_and_install_hint(make_dist, tmp_path):
    install_greeter(make_dist)
    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, plugins={"greter": True, "wandb": {}}))
    assert info.value.lines == [
        "plugins.greter: unknown plugin 'greter' (did you mean 'greeter'?)",
        "plugins.wandb: unknown plugin 'wandb'; `hookrun plugins list` shows the installed plugins",
    ]


def test_invalid_settings_are_reported_with_dotted_paths(make_dist, tmp_path):
    install_greeter(make_dist)
    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, plugins={"greeter": {"times": 0, "greting": "x"}}))
    assert info.value.lines == [
        "plugins.greeter.times: Input should be greater than or equal to 1 (got 0)",
        "plugins.greeter.greting: unknown setting (did you mean 'greeting'?)",
    ]


def test_misspelled_hook_name_is_rejected(tmp_path):
    class Typo:
        @hookimpl
        def after_train_itr(self, runner):
            pass

    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, hooks=[Typo()]))
    assert info.value.lines == [
        "Typo ('Typo'): method 'after_train_itr' is marked @hookimpl but no hook point is "
        "named 'after_train_itr' (did you mean 'after_train_iter'?)"
    ]


def test_unknown_argument_name_is_rejected(tmp_path):
    class BadArg:
        name = "bad"

        @hookimpl
        def after_train_iter(self, runner, output):
            pass

    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, hooks=[BadArg()]))
    assert info.value.lines == [
        "BadArg ('bad'): method 'after_train_iter' takes argument 'output' that hook point "
        "'after_train_iter' does not pass (did you mean 'outputs'?) "
        "(it passes: runner, batch_idx, batch, outputs)"
    ]


def test_unmarked_hook_method_is_rejected(tmp_path):
    class Forgot:
        def before_train(self, runner):
            pass

    with pytest.raises(
        PluginError, match="'before_train' matches a hook point but lacks @hookimpl"
    ):
        Runner(**toy_runner_kwargs(tmp_path, hooks=[Forgot()]))


def test_hook_wrappers_still_run_in_priority_order():
    log = []

    class Wrapper:
        priority = 90

        @hookimpl(wrapper=True)
        def before_train(self):
            log.append("wrap-in")
            result = yield
            log.append("wrap-out")
            return result

    manager = PluginManager({}, [Tagged("late", log, 70), Wrapper(), Tagged("early", log, 10)])
    manager.hooks.before_train(runner=None)
    assert log == ["wrap-in", "early", "late", "wrap-out"]


def test_plugin_state_round_trips_through_checkpoints(tmp_path):
    class Counter(Plugin):
        name = "counter"

        def __init__(self):
            super().__init__(PluginSettings())
            self.count = 0

        @hookimpl
        def after_train_iter(self):
            self.count += 1

        def state_dict(self):
            return {"count": self.count}

        def load_state_dict(self, state):
            self.count = state["count"]

    first = Counter()
    runner = Runner(**toy_runner_kwargs(tmp_path, hooks=[first], max_epochs=1))
    runner.train()
    runner.save_checkpoint(tmp_path / "c.pt")
    second = Counter()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[second])).load_checkpoint(tmp_path / "c.pt")
    assert second.count == first.count == 3


def test_a_plugin_with_a_folder_in_the_clone_not_installed_names_its_folder(monkeypatch, capsys):
    """Run from a clone, a plugin not installed whose ``plugins/hookrun-<name>`` folder is
    beside the core gets that folder as its hint (the package index does not have hookrun's
    own plugins yet); any other name gets the ``pip install hookrun-<name>`` convention. The
    core keeps no list of its plugins: the clone's folders are the list."""
    from hookrun.hooks import discovery
    from hookrun.testing import run_cli

    root = Path(__file__).resolve().parent.parent
    assert (root / "plugins" / "hookrun-ema" / "pyproject.toml").is_file()
    real = discovery.installed
    monkeypatch.setattr(
        discovery, "installed", lambda group: {k: v for k, v in real(group).items() if k != "ema"}
    )
    code, out, err = run_cli(capsys, "plugins", "show", "ema")
    assert (code, out) == (2, "")
    assert err.strip() == (
        "plugins show: plugin 'ema' is not installed; pip install "
        f"{root / 'plugins' / 'hookrun-ema'}"
    )
    code, out, err = run_cli(capsys, "plugins", "show", "grad_stats")
    assert (code, out) == (2, "")
    assert err.strip() == (
        "plugins show: unknown plugin 'grad_stats'; `hookrun plugins list` shows the installed "
        "plugins"
    )
    assert not (root / "plugins" / "hookrun-grad-stats").exists()


def test_install_hints_follow_the_clone_folders_not_a_list(monkeypatch, tmp_path):
    """A plugins/ or writers/ folder added to (or missing from) the clone changes the hints:
    the names come from the folders beside the core, so a hookrun installed without a clone
    gives the generic hint for every name."""
    import importlib.util

    from hookrun.hooks import discovery

    clone = tmp_path / "clone"
    (clone / "core" / "hookrun").mkdir(parents=True)
    (clone / "core" / "hookrun" / "__init__.py").write_text("")
    (clone / "plugins" / "hookrun-grad-stats").mkdir(parents=True)
    (clone / "plugins" / "hookrun-grad-stats" / "pyproject.toml").write_text("")
    (clone / "plugins" / "hookrun-notes").mkdir()  # no pyproject.toml: not a distribution
    spec = importlib.util.spec_from_file_location("hookrun", clone / "core/hookrun/__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert discovery.clone_folders("plugins") == {
        "grad_stats": clone / "plugins" / "hookrun-grad-stats"
    }
    assert discovery.unknown_plugin_message("grad_stats", "plugins.grad_stats", []) == (
        "plugins.grad_stats: plugin 'grad_stats' is not installed; pip install "
        f"{clone / 'plugins' / 'hookrun-grad-stats'}"
    )
    assert discovery.unknown_plugin_message("ema", "plugins.ema", []) == (
        "plugins.ema: unknown plugin 'ema'; `hookrun plugins list` shows the installed plugins"
    )
    assert discovery.clone_folders("writers") == {}


def test_disabling_one_of_hookruns_own_plugins_that_is_not_installed_is_accepted(
    monkeypatch, tmp_path
):
    """`timer: false` in a config shared with an environment without the timer plugin has
    nothing to disable; enabling it, or disabling an unknown name (a typo would leave the
    plugin it meant on), stays an error."""
    import hookrun.hooks.manager

    real = hookrun.hooks.manager.scan  # what the manager finds installed: all but the timer
    monkeypatch.setattr(
        hookrun.hooks.manager,
        "scan",
        lambda group: ({k: v for k, v in real(group)[0].items() if k != "timer"}, {}),
    )
    runner = Runner(**toy_runner_kwargs(tmp_path / "a", plugins={"timer": False, "ema": {}}))
    assert list(runner.plugins) == ["ema"]
    for plugins, line in [
        ({"timer": {}}, "plugins.timer: plugin 'timer' is not installed; pip install"),
        ({"timr": False}, "plugins.timr: unknown plugin 'timr'"),
    ]:
        with pytest.raises(PluginError) as info:
            Runner(**toy_runner_kwargs(tmp_path / "b", plugins=plugins))
        assert info.value.lines[0].startswith(line), info.value.lines

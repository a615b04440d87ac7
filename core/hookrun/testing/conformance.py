"""Plugin conformance: the checks every installed plugin passes (settings described and
documented, defaults construct, state survives a checkpoint, trains alone, imports from
hookrun only what ``hookrun.__all__`` exports)."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hookrun.testing.states import assert_states_equal
from hookrun.testing.task import toy_model, toy_runner_kwargs

if TYPE_CHECKING:
    from hookrun.engine.runner import Runner
    from hookrun.hooks.plugin import Plugin


def plugin_class(name: str) -> type[Plugin[Any]]:
    """The installed plugin class registered as ``name`` in the ``hookrun.plugins`` group."""
    from hookrun.hooks.discovery import installed_plugins

    found = installed_plugins()
    assert name in found, f"no installed plugin {name!r} (installed: {sorted(found)})"
    cls: type[Plugin[Any]] = found[name].entry_point.load()
    return cls


def check_settings_described(name: str) -> None:
    """Every settings field has a non-empty ``description``."""
    fields = plugin_class(name).Settings.model_fields
    missing = [f for f, info in fields.items() if not (info.description or "").strip()]
    assert not missing, f"{name}: settings without a description: {missing}"


def check_docs_page(name: str, page: str | Path) -> None:
    """The plugin's documentation page exists and mentions every settings field by name."""
    page = Path(page)
    assert page.is_file(), f"{name}: no documentation page {page}"
    text = page.read_text(encoding="utf-8")
    fields = plugin_class(name).Settings.model_fields
    missing = [f for f in fields if f not in text]
    assert not missing, f"{name}: {page} does not mention {missing}"


def check_default_settings(name: str) -> None:
    """``Settings()`` constructs, and the plugin constructs from it."""
    cls = plugin_class(name)
    settings = cls.Settings()
    assert cls(settings).settings == settings


def _train_alone(name: str, tmp_path: Path) -> Runner:
    """A toy run (with a BatchNorm layer) with only ``name`` enabled, at default settings."""
    from hookrun import Runner

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
        patch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)
        kwargs = toy_runner_kwargs(Path(tmp_path), model=toy_model(batch_norm=True))
        runner = Runner(**kwargs, plugins={name: {}})
        runner.train()
    return runner


def check_works_alone(name: str, tmp_path: str | Path) -> None:
    """A run with only this plugin enabled (autoload off) trains to the end."""
    runner = _train_alone(name, Path(tmp_path))
    assert list(runner.plugins) == [name]
    assert (runner.epoch, runner.iter) == (2, 6), "the run stopped early"


def check_state_round_trip(name: str, tmp_path: str | Path) -> None:
    """The plugin's state survives a real checkpoint file: saved after a toy run, loaded with
    ``weights_only=True``, given to a fresh instance, which reports the same state."""
    import torch

    cls = plugin_class(name)
    if not (hasattr(cls, "state_dict") and hasattr(cls, "load_state_dict")):
        pytest.skip(f"{name} keeps no state")
    runner = _train_alone(name, Path(tmp_path))
    path = Path(tmp_path) / "conformance.pt"
    runner.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["plugins"][name]
    fresh: Any = cls(cls.Settings())  # state_dict/load_state_dict are optional, so untyped
    fresh.load_state_dict(saved)
    assert_states_equal(fresh.state_dict(), saved, f"{name}.state_dict()")


def plugin_source_files(name: str) -> list[Path]:
    """The ``.py`` files of the package that holds the plugin (found without importing it)."""
    from hookrun.hooks.discovery import installed_plugins

    top = installed_plugins()[name].value.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None, f"{name}: cannot find package {top!r}"
    if spec.submodule_search_locations:
        return sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin else []


def is_test_file(path: str | Path) -> bool:
    """Whether ``path`` names a file pytest reads (``test_*.py``, ``*_test.py``,
    ``conftest.py``): only tests may import ``hookrun.testing``. By name alone, so where the
    package is installed does not matter."""
    name = Path(path).name
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def internal_imports(source: str, *, test_file: bool = False) -> list[tuple[int, str]]:
    """``(line, hookrun.name)`` for each use in a Python source of a hookrun name outside
    ``hookrun.__all__``: a submodule (``import hookrun.distributed.process_group``,
    ``from hookrun.errors
    import x``), ``from hookrun import name`` or ``hookrun.name`` after ``import hookrun``.
    ``hookrun.__all__`` is the whole of a plugin's API; a test file may also use
    ``hookrun.testing``."""
    import hookrun

    public = set(hookrun.__all__) | ({"testing"} if test_file else set())
    found: set[tuple[int, str]] = set()
    aliases: set[str] = set()  # the names bound to the ``hookrun`` package itself
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
            aliases |= {
                a.asname or "hookrun"
                for a in node.names
                if a.name == "hookrun" or (a.name.startswith("hookrun.") and not a.asname)
            }
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
            if node.module == "hookrun":
                found |= {
                    (a.lineno, f"hookrun.{a.name}")
                    for a in node.names
                    if a.name != "*" and a.name not in public
                }
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if (
                parts[0] == "hookrun"
                and len(parts) > 1
                and not (test_file and parts[1] == "testing")
            ):
                found.add((node.lineno, module))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in public
        ):
            found.add((node.lineno, f"hookrun.{node.attr}"))
    return sorted(found)


def check_no_internal_imports(name: str) -> None:
    """The plugin's package uses from hookrun only names in ``hookrun.__all__`` (and, in its
    test files, ``hookrun.testing``): that and the runner surface are a plugin's API."""
    problems = [
        f"{path}:{line}: {used}"
        for path in plugin_source_files(name)
        for line, used in internal_imports(
            path.read_text(encoding="utf-8"), test_file=is_test_file(path)
        )
    ]
    assert not problems, f"{name} uses hookrun names outside hookrun.__all__:\n" + "\n".join(
        problems
    )


CONFORMANCE_CHECKS: dict[str, Callable[..., None]] = {
    "settings_described": lambda name, tmp_path, docs_page: check_settings_described(name),
    "docs_page": lambda name, tmp_path, docs_page: check_docs_page(name, docs_page),
    "default_settings": lambda name, tmp_path, docs_page: check_default_settings(name),
    "state_round_trip": lambda name, tmp_path, docs_page: check_state_round_trip(name, tmp_path),
    "works_alone": lambda name, tmp_path, docs_page: check_works_alone(name, tmp_path),
    "no_internal_imports": lambda name, tmp_path, docs_page: check_no_internal_imports(name),
}
"""Every conformance check by name, each called as ``check(name, tmp_path, docs_page)``."""


def check_plugin_conformance(
    name: str, tmp_path: str | Path, docs_page: str | Path | None = None
) -> None:
    """Run every conformance check on the installed plugin ``name``; the docs page check only
    when ``docs_page`` is given. The first failing check fails the test."""
    for check, run in CONFORMANCE_CHECKS.items():
        if check == "docs_page" and docs_page is None:
            continue
        if check == "state_round_trip":
            cls = plugin_class(name)
            if not (hasattr(cls, "state_dict") and hasattr(cls, "load_state_dict")):
                continue
        run(name, Path(tmp_path) / check, docs_page)

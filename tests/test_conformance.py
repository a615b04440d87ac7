"""Every installed plugin keeps the plugin contract: ``hookrun.testing``'s conformance checks,
one test per (plugin, check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookrun.hooks.discovery import installed_plugins
from hookrun.testing import CONFORMANCE_CHECKS, internal_imports, is_test_file

ROOT = Path(__file__).resolve().parent.parent

# (plugin, check) pairs that fail today, with the reason. Strict: an entry whose check starts
# passing fails the suite, so it is removed as soon as its plugin is fixed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def built_in(name: str) -> bool:
    """Whether ``name`` comes from this repository (its docs page is then ours to check)."""
    distribution = installed_plugins()[name].distribution
    return (ROOT / "plugins" / distribution).is_dir()


def cases() -> list:
    return [
        pytest.param(
            name,
            check,
            id=f"{name}-{check}",
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[name, check])]
            if (name, check) in KNOWN_FAILURES
            else [],
        )
        for name in installed_plugins()
        for check in CONFORMANCE_CHECKS
    ]


@pytest.mark.parametrize(("name", "check"), cases())
def test_plugin_conformance(name: str, check: str, tmp_path: Path) -> None:
    if check == "docs_page" and not built_in(name):
        pytest.skip(f"{name} is not a built-in plugin: its documentation lives with it")
    CONFORMANCE_CHECKS[check](name, tmp_path, ROOT / "docs" / "plugins" / f"{name}.md")


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from hookrun import Plugin, hookimpl, __version__\nfrom hookrun import *\n", []),
        ("from hookrun import all_reduce_sum, barrier, rank_zero_only\n", []),
        ("from hookrun.process_group import init_from_env\n", [(1, "hookrun.process_group")]),
        ("from hookrun.collectives import barrier\n", [(1, "hookrun.collectives")]),
        ("from hookrun import Runner, process_group\n", [(1, "hookrun.process_group")]),
        (
            "from hookrun import (\n    Plugin,\n    process_group as pg,\n)\n",
            [(3, "hookrun.process_group")],
        ),
        ("import hookrun.process_group\n", [(1, "hookrun.process_group")]),
        ("import hookrun.process_group as pg\n", [(1, "hookrun.process_group")]),
        ("from hookrun.errors import ConfigError\n", [(1, "hookrun.errors")]),
        ("from hookrun.writers import Writer\n", [(1, "hookrun.writers")]),
        ("def f():\n    from hookrun import checkpoint\n", [(2, "hookrun.checkpoint")]),
        (
            "import hookrun\n\nhookrun.barrier()\nhookrun.collectives.barrier()\n",
            [(4, "hookrun.collectives")],
        ),
        ("import hookrun as hr\n\nhr.runner.Runner\n", [(3, "hookrun.runner")]),
        ("from hookrun.testing import toy_model\n", [(1, "hookrun.testing")]),
        ("from . import dist\nimport hookrunner.dist\nfrom hookrun_ema import x\n", []),
    ],
)
def test_internal_imports_allows_only_hookrun_all(
    source: str, found: list[tuple[int, str]]
) -> None:
    assert internal_imports(source) == found


def test_internal_imports_allows_hookrun_testing_in_tests_only() -> None:
    source = "import hookrun.testing\nfrom hookrun.testing.task import toy_model\n"
    assert internal_imports(source, test_file=True) == []
    assert internal_imports(source) == [(1, "hookrun.testing"), (2, "hookrun.testing.task")]
    assert internal_imports("from hookrun import testing, process_group\n", test_file=True) == [
        (1, "hookrun.process_group")
    ]
    files = [
        "tests/test_x.py",
        "x_test.py",
        "tests/conftest.py",
        "tests/x.py",
        "hookrun_x/testing.py",
    ]
    assert [is_test_file(path) for path in files] == [True, True, True, False, False]

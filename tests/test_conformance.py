"""Every installed plugin keeps the plugin contract: ``hookrun.testing``'s conformance checks,
one test per (plugin, check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hookrun.discovery import installed_plugins
from hookrun.testing import CONFORMANCE_CHECKS

ROOT = Path(__file__).resolve().parent.parent

# (plugin, check) pairs that fail today, e.g. ("timer", "no_internal_imports"). Strict: an
# entry whose check starts passing fails the suite, so it is removed as soon as its plugin is
# fixed. (checkpoint, precise_bn and timer had no_internal_imports here until they were.)
KNOWN_FAILURES: set[tuple[str, str]] = set()


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
            marks=[pytest.mark.xfail(strict=True, reason="internal import removal in progress")]
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

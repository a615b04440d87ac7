"""The documentation: every hook point and setting documented, generated parts complete,
and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hookrun import hookspecs
from hookrun.config import Config, RunnerConfig
from hookrun.discovery import installed_plugins
from hookrun.dispatch import hook_arguments, hook_points

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILT_IN = sorted(
    p.name.removeprefix("hookrun-").replace("-", "_") for p in (ROOT / "plugins").glob("hookrun-*")
)


def docs_hooks():
    spec = importlib.util.spec_from_file_location("hookrun_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_hook_point_is_documented_with_arguments_and_example():
    for name in hook_points():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert doc.strip(), f"hook point {name} has no docstring"
        assert "Arguments:" in doc and "Example::" in doc, name
        for argument in hook_arguments(name):
            assert f"``{argument}``" in doc, f"{name}: argument {argument} is not described"


@pytest.mark.parametrize("name", sorted(installed_plugins()))
def test_every_setting_of_every_installed_plugin_has_a_description(name):
    cls = installed_plugins()[name].entry_point.load()
    missing = [f for f, info in cls.Settings.model_fields.items() if not info.description]
    assert not missing, f"plugins.{name}: settings without a description: {missing}"


def test_every_config_key_has_a_description():
    for model in (Config, RunnerConfig):
        missing = [f for f, info in model.model_fields.items() if not info.description]
        assert not missing, f"{model.__name__}: {missing}"


def test_hook_reference_is_generated_for_every_hook_point():
    page = docs_hooks().on_page_markdown((DOCS / "hooks.md").read_text())
    assert "<!-- hook-reference -->" not in page
    for name in hook_points():
        args = ", ".join(["self", *hook_arguments(name)])
        assert f"## `{name}`" in page and f"def {name}({args}): ..." in page
    assert not re.search(r"(?<!`)``\w", page)  # reST literals converted to Markdown


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_built_in_plugin_page_gets_its_settings_table(name):
    page = DOCS / "plugins" / f"{name}.md"
    assert page.is_file(), f"{page} is missing"
    text = page.read_text()
    assert f"<!-- settings-table: {name} -->" in text
    if name not in installed_plugins():
        pytest.skip(f"{name} is not installed here")
    rendered = docs_hooks().on_page_markdown(text)
    assert "settings-table" not in rendered
    settings = installed_plugins()[name].entry_point.load().Settings
    for field in settings.model_fields:
        assert f"| `{field}` |" in rendered


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ema = (tmp_path / "plugins" / "ema" / "index.html").read_text()
    assert "<table>" in ema and "decay" in ema

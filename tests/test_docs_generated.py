"""The generated sections of the docs (hook points, config tables, every command's --help, the
plugins' call order) are committed in the markdown; each must equal what the code renders
now, so a reader of the raw files on GitHub sees what the built site shows."""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def load_generator():
    spec = importlib.util.spec_from_file_location("hookrun_docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = load_generator()
PAGES = [page.relative_to(ROOT).as_posix() for page in generate.pages()]


def test_the_reference_pages_hold_generated_sections():
    expected = {"docs/hooks.md", "docs/config.md", "docs/cli.md", "docs/commands/train.md"}
    assert expected <= set(PAGES)
    assert len([p for p in PAGES if p.startswith("docs/commands/")]) == len(
        list((DOCS / "commands").glob("*.md"))
    )


@pytest.mark.parametrize("page", PAGES)
def test_committed_section_equals_what_the_code_renders(page):
    text = (ROOT / page).read_text()
    opened = text.count("<!-- generated:")
    assert opened == len(generate.SECTION.findall(text)), f"{page}: a section is not closed"
    rendered = generate.render(text)
    if rendered != text:
        diff = "".join(
            difflib.unified_diff(
                text.splitlines(True), rendered.splitlines(True), page, "rendered now", n=1
            )
        )
        pytest.fail(f"{page} is stale; run `{generate.COMMAND}` and commit it\n{diff[:3000]}")
    for match in generate.SECTION.finditer(text):
        body = text[match.end("open") : match.start("close")]
        assert body.strip(), f"{page}: section {match['what']!r} is empty"


def test_check_names_a_stale_page_and_regenerating_restores_it(tmp_path):
    """The command a failure names, as a real process on a copy of the generator and the
    command pages: --check exits 1 naming the page and changes nothing; without --check it
    writes the page back as committed."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "commands", docs / "commands")
    shutil.copy(DOCS / "generate.py", docs)
    page = docs / "commands" / "train.md"
    good = hashlib.sha256(page.read_bytes()).hexdigest()
    page.write_text(re.sub(r"--smoke", "--smoky", page.read_text()))
    stale = hashlib.sha256(page.read_bytes()).hexdigest()

    check = [sys.executable, str(docs / "generate.py"), "--check"]
    result = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr == (
        "docs/commands/train.md: generated sections are stale; run `python docs/generate.py`\n"
    )
    assert hashlib.sha256(page.read_bytes()).hexdigest() == stale

    result = subprocess.run(check[:2], cwd=tmp_path, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "docs/commands/train.md: regenerated\n")
    assert hashlib.sha256(page.read_bytes()).hexdigest() == good


def test_a_settings_section_renders_every_setting_of_the_plugin():
    """The kind a plugin page uses to hold its settings table in the file."""
    from hookrun.hooks.discovery import installed_plugins

    name = sorted(installed_plugins())[0]
    page = generate.render(f"<!-- generated: settings {name} -->\n<!-- end generated -->\n")
    assert page.startswith(f"<!-- generated: settings {name} -->\n\nPlugin `{name}` from")
    assert page.endswith("|\n\n<!-- end generated -->\n")
    for field in installed_plugins()[name].entry_point.load().Settings.model_fields:
        assert f"| `{field}` |" in page

"""The reference parts of the docs, generated from the code into the markdown itself, so that
GitHub, an editor and the built site show the same text.

A generated section sits between two comments and is rewritten whole::

    <!-- generated: KIND ARGS -->
    ...
    <!-- end generated -->

KIND is one of:

- ``hooks``: every hook point of ``hookrun.hooks.specs``, its arguments and docstring;
- ``config runner|optimizer|scheduler|warmup``: that config section's table, from its
  pydantic model (setting, type, default, constraints, description);
- ``settings NAME``: installed plugin NAME's settings table, from its ``Settings``;
- ``help [WORDS]``: ``hookrun WORDS --help`` as click prints it at 100 columns;
- ``output ARGS``: ``hookrun ARGS`` run in the repository's root, with what it prints (a
  command whose output depends only on the repository's files);
- ``call-order``: the call order at every hook point of the installed plugins, as
  ``hookrun plugins list --load`` prints it.

``python docs/generate.py`` rewrites every page under ``docs/`` (and reports which changed);
``python docs/generate.py --check`` changes nothing and exits 1 naming each stale page.
``tests/test_docs_generated.py`` runs the same check in the suite. The same module is the
mkdocs hook (``mkdocs.yml``), which renders the sections again while building, so the site
never shows a section older than the code; the plugin pages' one-line
``<!-- settings-table: NAME -->`` marker is expanded there too. A missing plugin or an
undocumented setting is a warning, which ``mkdocs build --strict`` turns into a failure.

It lives under ``docs/`` and is never imported by hookrun itself.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.hookrun")

DOCS = Path(__file__).resolve().parent
COMMAND = "python docs/generate.py"
SECTION = re.compile(
    r"(?P<open><!-- generated: (?P<what>[^>]*?) -->\n).*?(?P<close><!-- end generated -->)",
    flags=re.S,
)
SETTINGS_MARKER = re.compile(r"<!--\s*settings-table:\s*([A-Za-z0-9_]+)\s*-->")
ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):(?=<code>)")


def section(what: str) -> str:
    """The markdown of one generated section, from the words after ``generated:``."""
    kind, _, args = what.partition(" ")
    if kind == "hooks":
        return hook_reference()
    if kind == "config":
        return config_table(args)
    if kind == "settings":
        return settings_table(args)
    if kind == "help":
        return "```text\n" + cli_output([*args.split(), "--help"]) + "```\n"
    if kind == "output":
        return f"```text\n$ hookrun {args}\n" + cli_output(args.split()) + "```\n"
    if kind == "call-order":
        listing = cli_output(["plugins", "list", "--load"])
        return "```text\n" + listing[listing.index("hook point") :] + "```\n"
    raise ValueError(f"unknown generated section {what!r}")


def render(markdown: str) -> str:
    """``markdown`` with every generated section rendered from the code as it is now."""
    return SECTION.sub(
        lambda m: m["open"] + "\n" + section(m["what"]).rstrip("\n") + "\n\n" + m["close"],
        markdown,
    )


def pages() -> list[Path]:
    """Every markdown page holding a generated section."""
    found = sorted(DOCS.rglob("*.md"))
    return [page for page in found if SECTION.search(page.read_text())]


def stale_pages() -> list[Path]:
    """The pages whose committed sections differ from what the code renders now."""
    return [page for page in pages() if render(page.read_text()) != page.read_text()]


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    stale = stale_pages()
    for page in stale:
        where = page.relative_to(DOCS.parent)
        if check:
            print(f"{where}: generated sections are stale; run `{COMMAND}`", file=sys.stderr)
        else:
            page.write_text(render(page.read_text()))
            print(f"{where}: regenerated")
    return 1 if check and stale else 0


# -- the mkdocs hook -------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    markdown = render(markdown)
    return SETTINGS_MARKER.sub(lambda m: settings_table(m.group(1)), markdown)


def on_page_content(html: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """The docstrings' reST roles (:class:`X`) reach the API pages as ``:class:`` before the
    code: drop the role, keep the code."""
    return ROLE.sub("", html)


# -- the sections ----------------------------------------------------------------------------


def cli_output(args: list[str]) -> str:
    """``hookrun ARGS`` in the repository's root at a fixed width of 100 columns (the CLI's
    own maximum), stdout and stderr as a terminal shows them. The folder a task file was
    imported from leaves ``sys.path`` again (the generator runs inside tests and mkdocs)."""
    from click.testing import CliRunner

    from hookrun.cli.commands import cli

    path = list(sys.path)
    try:
        with contextlib.chdir(DOCS.parent):
            result = CliRunner().invoke(cli, args, prog_name="hookrun", terminal_width=100)
    finally:
        sys.path[:] = path
    if result.exit_code != 0:
        log.warning("hookrun %s failed: %s", " ".join(args), result.output)
    return result.output


def config_table(name: str) -> str:
    """``runner``, ``optimizer``, ``scheduler`` or ``scheduler.warmup``, from their models."""
    from hookrun.config.file import RunnerConfig
    from hookrun.config.optimizers import OptimizerConfig
    from hookrun.config.schedulers import SchedulerConfig, Warmup

    models = {
        "runner": RunnerConfig,
        "optimizer": OptimizerConfig,
        "scheduler": SchedulerConfig,
        "warmup": Warmup,
    }
    return table(models[name], "scheduler.warmup" if name == "warmup" else name)


def settings_table(name: str) -> str:
    """The settings table of installed plugin ``name`` (plus its priority line)."""
    from hookrun.hooks.discovery import installed_plugins

    info = installed_plugins().get(name)
    if info is None:
        log.warning("settings-table: plugin %r is not installed; pip install -e it first", name)
        return f"*(settings of `{name}`: plugin not installed when the docs were built)*"
    cls = info.entry_point.load()
    default = "on" if cls.enabled_by_default else "off"
    head = (
        f"Plugin `{name}` from `{info.distribution}`; priority **{int(cls.priority)}**; "
        f"enabled by default: **{default}**. Any section may also set `priority:`.\n\n"
    )
    return head + table(cls.Settings, f"plugins.{name}")


def table(settings_cls: Any, where: str) -> str:
    from hookrun.config.file import settings_rows

    lines = [
        "| setting | type | default | constraints | description |",
        "|---|---|---|---|---|",
    ]
    for row in settings_rows(settings_cls):
        if not row["description"]:
            log.warning("%s.%s has no description", where, row["name"])
        cells = [
            f"`{row['name']}`",
            row["type"],
            f"`{row['default']}`",
            row["constraints"],
            row["description"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def hook_reference() -> str:
    """Every hook point, in declaration order, with its signature and docstring."""
    from hookrun.hooks import specs as hookspecs
    from hookrun.hooks.dispatch import hook_arguments, hook_points

    parts = []
    for name in hook_points():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        if not doc.strip():
            log.warning("hook point %r has no docstring", name)
        signature = f"{name}({', '.join(['self', *hook_arguments(name)])}): ..."
        parts.append(
            f"## `{name}`\n\n```python\n@hookimpl\ndef {signature}\n```\n\n{rst_to_md(doc)}"
        )
    return "\n\n".join(parts) + "\n"


def rst_to_md(doc: str) -> str:
    """The few reST forms the hookspec docstrings use: ``code``, :role:`x`, ``Example::``."""
    out: list[str] = []
    prose: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            prose.append(line)
            continue
        prose.append(line.rstrip()[:-1])
        out.append(_prose(prose))
        prose = []
        block = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            block.append(lines[i][4:])
            i += 1
        code = "\n".join(block).strip("\n")
        out.append(f"\n```python\n{code}\n```\n")
    out.append(_prose(prose))
    return "\n".join(out)


def _prose(lines: list[str]) -> str:
    """Literals may span lines; "Arguments:", "A hook may:" and "Return:" start paragraphs."""
    text = "\n".join(lines)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    text = re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)
    return re.sub(r"\n(Arguments:|A hook may:|Return:)", r"\n\n**\1**", text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

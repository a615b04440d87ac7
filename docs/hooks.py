"""mkdocs hooks: generate the reference parts of the docs from the code.

- ``<!-- hook-reference -->`` becomes every hook point of ``hookrun.hooks.specs`` with its
  arguments and docstring (the docstrings are the reference; nothing is copied by hand);
- ``<!-- settings-table: NAME -->`` becomes plugin NAME's settings table, from the JSON
  schema of its pydantic ``Settings`` (field, type, default, constraints, description);
- ``<!-- runner-table -->`` and ``<!-- config-table: optimizer|scheduler|warmup -->`` become
  the tables of those config sections, from their pydantic models;
- ``<!-- cli-help: COMMAND -->`` becomes ``hookrun COMMAND --help`` as click prints it (the
  pages under ``docs/commands/``), so the command pages cannot drift from the CLI.

A missing plugin or an undocumented setting is a warning, which ``mkdocs build --strict``
turns into a failed build.
"""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any

log = logging.getLogger("mkdocs.plugins.hookrun")

SETTINGS_MARKER = re.compile(r"<!--\s*settings-table:\s*([A-Za-z0-9_]+)\s*-->")
HOOKS_MARKER = "<!-- hook-reference -->"
CONFIG_MARKER = "<!-- runner-table -->"
CLI_MARKER = re.compile(r"<!--\s*cli-help:\s*([a-z ]*?)\s*-->")
ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):(?=<code>)")
SECTION_MARKER = re.compile(r"<!--\s*config-table:\s*(optimizer|scheduler|warmup)\s*-->")


def on_page_markdown(markdown: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    markdown = SETTINGS_MARKER.sub(lambda m: settings_table(m.group(1)), markdown)
    markdown = CLI_MARKER.sub(lambda m: "```text\n" + cli_help(m.group(1)) + "```\n", markdown)
    if HOOKS_MARKER in markdown:
        markdown = markdown.replace(HOOKS_MARKER, hook_reference())
    if CONFIG_MARKER in markdown:
        from hookrun.config.file import RunnerConfig

        markdown = markdown.replace(CONFIG_MARKER, table(RunnerConfig, "runner"))
    return SECTION_MARKER.sub(lambda m: section_table(m.group(1)), markdown)


def on_page_content(html: str, page: Any = None, config: Any = None, files: Any = None) -> str:
    """The docstrings' reST roles (:class:`X`) reach the API pages as ``:class:`` before the
    code: drop the role, keep the code."""
    return ROLE.sub("", html)


def cli_help(command: str) -> str:
    """``hookrun COMMAND --help`` at a fixed width of 100 columns (the CLI's own maximum)."""
    from click.testing import CliRunner

    from hookrun.cli.commands import cli

    args = [*command.split(), "--help"]
    result = CliRunner().invoke(cli, args, prog_name="hookrun", terminal_width=100)
    if result.exit_code != 0:
        log.warning("cli-help: hookrun %s failed: %s", " ".join(args), result.output)
    return result.output


def section_table(name: str) -> str:
    """``optimizer``, ``scheduler`` or ``scheduler.warmup`` of config files, from their models."""
    from hookrun.config.optimizers import OptimizerConfig, SchedulerConfig, Warmup

    models = {"optimizer": OptimizerConfig, "scheduler": SchedulerConfig, "warmup": Warmup}
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

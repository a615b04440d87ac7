"""``hookrun plugins list|show|new`` and ``hookrun hooks``: what is installed and where it can
hook in. ``plugins list`` stays on entry-point metadata (no plugin import) unless ``--load``."""

from __future__ import annotations

from typing import Any

import click

from hookrun.cli.console import aligned, echo, print_call_order, to_json
from hookrun.cli.options import Command, CommandGroup, PathType, check_place
from hookrun.errors import HookrunError


@click.group(cls=CommandGroup)
def plugins() -> None:
    """Installed plugins (entry points of the hookrun.plugins group)."""


@plugins.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per plugin.")
@click.option(
    "--load",
    is_flag=True,
    help="Import each plugin: add priority, default state, hook points and load errors.",
)
def plugins_list(as_json: bool, load: bool) -> None:
    """List installed plugins; fast, from package metadata only unless --load is given."""
    from hookrun.hooks.discovery import (
        PLUGIN_GROUP,
        blocked_plugins,
        clash_message,
        clashes,
        install_from_clone,
        installed_plugins,
    )

    found = installed_plugins()
    blocked = blocked_plugins()
    for name, infos in clashes(PLUGIN_GROUP).items():
        echo(f"warning: {clash_message('plugin', name, infos)}", err=True)
    rows: list[dict[str, Any]] = [info.as_row() for info in found.values()]
    if load:
        from hookrun.hooks.inspection import describe_plugin

        for row in rows:
            row.update(describe_plugin(row["name"], found, blocked))
    if as_json:
        echo(to_json(rows))
        return
    if not rows:
        echo(f"no plugins installed; hookrun's own, e.g. {install_from_clone('plugins', 'logger')}")
        return
    header = ["name", "distribution", "version", "entry point"]
    grid = [[r["name"], r["distribution"], r["version"], r["entry_point"]] for r in rows]
    if load:
        header += ["priority", "default", "hooks", "status"]
        for line, r in zip(grid, rows, strict=True):
            line += [
                "" if r["priority"] is None else str(r["priority"]),
                {True: "on", False: "off", None: ""}[r["enabled_by_default"]],
                str(len(r["hooks"])),
                r["status"],
            ]
    else:
        for line, r in zip(grid, rows, strict=True):
            if r["name"] in blocked:
                line[0] += " (blocked)"
    echo(aligned(grid, header))
    if load:
        print_call_order(rows)


@plugins.command(name="show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def plugins_show(name: str, as_json: bool) -> None:
    """Describe one plugin: settings with type, default, constraints and description."""
    from hookrun.hooks.discovery import blocked_plugins, installed_plugins, unknown_plugin_message

    found = installed_plugins()
    if name not in found:
        raise HookrunError(unknown_plugin_message(name, "plugins show", found))
    if name in blocked_plugins():
        raise HookrunError(
            f"plugins show: plugin {name!r} is blocked by HOOKRUN_DISABLE_PLUGINS (never "
            "imported); unset it to inspect the plugin"
        )
    from hookrun.config.schema import settings_rows
    from hookrun.hooks.inspection import describe_plugin

    info = describe_plugin(name, found, set())
    if info["error"]:
        raise HookrunError(f"plugins show {name}: {info['error']}")

    cls = found[name].entry_point.load()
    doc = " ".join((cls.__doc__ or "").split())
    result = {
        **found[name].as_row(),
        "description": doc,
        "priority": info["priority"],
        "enabled_by_default": info["enabled_by_default"],
        "hooks": info["hooks"],
        "settings": settings_rows(cls.Settings),
    }
    if as_json:
        echo(to_json(result))
        return
    echo(f"{name}  ({result['distribution']} {result['version']}, {result['entry_point']})")
    if doc:
        echo(doc)
    state = "on" if result["enabled_by_default"] else "off"
    echo(f"priority {result['priority']}; enabled by default: {state}")
    echo(f"hook points: {', '.join(result['hooks'])}")
    echo()
    rows = [
        [r["name"], r["type"], r["default"], r["constraints"], r["description"]]
        for r in result["settings"]
    ]
    if rows:
        from rich.console import Console
        from rich.table import Table

        table = Table("setting", "type", "default", "constraints", "description", show_lines=True)
        for row in rows:
            table.add_row(*row)
        Console(highlight=False).print(table)
    else:
        echo("no settings")


@plugins.command(name="new")
@click.argument("name")
@click.option(
    "--dir", "directory", default=".", type=PathType(file_okay=False), help="Parent folder."
)
def plugins_new(name: str, directory: str) -> None:
    """Write a ready-to-install plugin package hookrun-NAME (pyproject, module, test)."""
    from hookrun.cli.scaffold import new_plugin

    check_place("--dir", directory, folder=True)
    root = new_plugin(name, directory)
    echo(f"wrote {root}; next: pip install -e {root} && hookrun plugins show {name}")


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Name, arguments and docs as JSON.")
def hooks(as_json: bool) -> None:
    """Every hook point with its arguments and documentation."""
    from hookrun.hooks.inspection import hook_entries

    entries = hook_entries()
    if as_json:
        echo(to_json(entries))
        return
    for entry in entries:
        echo(click.style(f"{entry['name']}({', '.join(entry['arguments'])})", bold=True))
        for line in entry["doc"].splitlines():
            echo(f"    {line}".rstrip())
        echo()

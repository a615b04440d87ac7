"""What the commands share: the group class that lists whole first paragraphs, the common
arguments and options, the path checks made before any work, the ``[hookrun]`` notice, and
a usage error worded as one line."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hookrun.cli.console import echo
from hookrun.errors import HookrunError


class Command(click.Command):
    """A command whose usage errors name it: click's parser raises some (``option '--set'
    requires an argument``) without the context, which the one line takes its
    ``hookrun train:`` from."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _naming_the_command(super().parse_args, ctx, args)


class CommandGroup(click.Group):
    """Lists each command with its whole first paragraph, not click's 45-character cut; its
    usage errors and its commands' name the command (:class:`Command`)."""

    command_class = Command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return _naming_the_command(super().parse_args, ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, " ".join((cmd.help or "").strip().split("\n\n")[0].split()))
            for name in self.list_commands(ctx)
            if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _naming_the_command(
    parse: Callable[[click.Context, list[str]], list[str]], ctx: click.Context, args: list[str]
) -> list[str]:
    """``parse(ctx, args)``, a usage error it raises given the context it lacked."""
    try:
        return parse(ctx, args)
    except click.UsageError as exc:
        if exc.ctx is None:
            exc.ctx = ctx
        raise


def _name(param: click.Parameter | None) -> str:
    """How a line names the parameter: the option (``--work-dir``) or argument (``CONFIG``)."""
    if param is None:
        return "path"
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


#: What an empty path option asks for, by option (the others: a path).
WANTED = {"--resume": "give auto or a checkpoint file", "--checkpoint": "give a checkpoint file"}


def path_name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A path argument or option whose name no file system takes (empty, a name over 255
    bytes, a NUL byte) is one line, exit 2, before anything is read or created."""
    from hookrun.config.arguments import path_problem

    refuse_empty(param, value, "give a path")  # '' would be the current folder
    problem = None if value is None or value == "auto" else path_problem(str(value))
    if problem:
        raise HookrunError(f"{_name(param)}: {problem} (got {str(value)!r})")
    return value


def refuse_empty(param: click.Parameter | None, value: Any, wanted: str) -> None:
    """An empty (or blank) path is one line naming the parameter and what it takes
    (:data:`WANTED`, else ``wanted``)."""
    if isinstance(value, str) and not value.strip():
        name = _name(param)
        raise HookrunError(f"{name}: {WANTED.get(name, wanted)} (got {value!r})")


class PathType(click.Path):
    """``click.Path`` that refuses an empty (or blank) name as one line, exit 2: click would
    make ``''`` the current folder (``--work-dir ''`` would train into it)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        wanted = "give a path" if self.file_okay and self.dir_okay else "give a file"
        refuse_empty(param, value, wanted if self.file_okay else "give a folder")
        return super().convert(value, param, ctx)


config_argument = click.argument(
    "config", type=PathType(dir_okay=False, path_type=Path), callback=path_name
)
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value (dotted key, YAML value); repeatable: --set runner.seed=1",
)
work_dir_option = click.option(
    "--work-dir",
    type=PathType(file_okay=False, path_type=Path),
    help="Run folder (overrides runner.work_dir); relative to the current directory.",
)
checkpoint_option = click.option(
    "--checkpoint",
    metavar="PATH",
    callback=path_name,
    help="Checkpoint file to evaluate (default: the run's latest checkpoint in the work dir).",
)


def notice(message: str) -> None:
    """A progress line of the command's own (before a Runner exists to print it)."""
    echo(f"[hookrun] {message}")


def check_place(where: str, path: str | Path, folder: bool) -> None:
    """Refuse an output path hookrun cannot create or write (a file where a folder goes, a
    folder where the file goes), before any work: :func:`hookrun.config.file.place_errors`."""
    from hookrun.config.file import place_errors

    errors = place_errors(where, path, folder)
    if errors:
        raise HookrunError(errors)


_SUGGESTION = re.compile(r"\.?\s+\(?Did you mean (.+?)\?\)?$")


def usage_line(exc: click.ClickException) -> str:
    """A usage error as one line, as every other mistake is: the command, then click's
    message with its suggestion (``hookrun train: no such option '--resum' (did you mean
    '--resume'?)``), without click's usage and ``Try --help`` lines."""
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "hookrun"
    message = " ".join(exc.format_message().split())
    message = _SUGGESTION.sub(r" (did you mean \1?)", message).removesuffix(".")
    if message[:1].isupper() and message[1:2].islower():  # "No such option", not "CONFIG"
        message = message[0].lower() + message[1:]
    return f"{where}: {message}"

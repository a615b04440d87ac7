"""hookrun's errors. :class:`HookrunError` and its subclasses are the user's to fix: the CLI
prints them as lines and exits with code 2. :class:`CheckpointError` is a runtime failure (a
full disk, an I/O error): one line, exit code 1."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class HookrunError(Exception):
    """A user mistake (bad config, unknown plugin, invalid hook); one or more lines."""

    def __init__(self, lines: str | list[str]) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        """The message, one problem a line (the CLI prints each)."""
        super().__init__("\n".join(self.lines))


class ConfigError(HookrunError):
    """The configuration is invalid; each line names a dotted path and what is wrong."""


class PluginError(HookrunError):
    """A plugin cannot be found, imported, configured or registered."""


class WorkDirBusyError(HookrunError):
    """Another run holds the work dir's lock (a user mistake: exit 2 from the CLI)."""


class CheckpointMismatchError(HookrunError):
    """A checkpoint the user named cannot be loaded or does not fit the run (keys, shapes,
    optimizer groups, RNG or loop state): one line naming the file and the first problem.

    ``path`` is the file; ``reason`` the line without the file's name."""

    def __init__(self, lines: str | list[str], path: object = None, reason: str = "") -> None:
        super().__init__(lines)
        self.path = path
        """The checkpoint file named."""
        self.reason = reason or "\n".join(self.lines)
        """What is wrong with it, without the file's name."""


class CheckpointError(Exception):
    """A checkpoint cannot be written at run time (disk full, I/O error, a value that
    ``weights_only`` loading would refuse); the message names the file. Not a user mistake
    in what was given: the CLI exits with code 1, without a traceback."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (empty when it has none): what an error that
    wraps another quotes of it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def validation_lines(exc: Any, prefix: str, fields: Iterable[str] = ()) -> list[str]:
    """One line per pydantic error: ``prefix.path: message (got value)``, with did-you-mean
    for unknown keys when the valid ``fields`` are given."""
    fields = list(fields)
    lines = []
    for err in exc.errors():
        path = ".".join([prefix, *(str(p) for p in err["loc"])] if prefix else map(str, err["loc"]))
        lines.append(error_line(path, err, fields))
    return lines


def error_line(path: str, err: Any, fields: Iterable[str] = (), what: str = "setting") -> str:
    """One pydantic error at ``path`` as a line: an unknown ``what`` with did-you-mean among
    ``fields``, a missing setting, or the message (without pydantic's "Value error, ") and
    the value given."""
    from hookrun.hooks.discovery import did_you_mean

    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1]) if err["loc"] else ""
        return f"{path}: unknown {what}{did_you_mean(key, list(fields))}"
    if err["type"] == "missing":
        return f"{path}: required setting is missing"
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{path}: {message} (got {err['input']!r})"

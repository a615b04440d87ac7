"""Errors that are the user's to fix: the CLI prints them as lines and exits with code 2."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class HookrunError(Exception):
    """A user mistake (bad config, unknown plugin, invalid hook); one or more lines."""

    def __init__(self, lines: str | list[str]) -> None:
        self.lines = [lines] if isinstance(lines, str) else list(lines)
        super().__init__("\n".join(self.lines))


class ConfigError(HookrunError):
    """The configuration is invalid; each line names a dotted path and what is wrong."""


class PluginError(HookrunError):
    """A plugin cannot be found, imported, configured or registered."""


class CheckpointError(HookrunError):
    """A checkpoint cannot be written or read; the message names the file."""


def validation_lines(exc: Any, prefix: str, fields: Iterable[str] = ()) -> list[str]:
    """One line per pydantic error: ``prefix.path: message (got value)``, with did-you-mean
    for unknown keys when the valid ``fields`` are given."""
    from hookrun.discovery import did_you_mean

    fields = list(fields)
    lines = []
    for err in exc.errors():
        path = (
            ".".join([prefix, *(str(p) for p in err["loc"])])
            if prefix
            else ".".join(str(p) for p in err["loc"])
        )
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1]) if err["loc"] else ""
            lines.append(f"{path}: unknown setting{did_you_mean(key, fields)}")
        elif err["type"] == "missing":
            lines.append(f"{path}: required setting is missing")
        else:
            lines.append(f"{path}: {err['msg']} (got {err['input']!r})")
    return lines

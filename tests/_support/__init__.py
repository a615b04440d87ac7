"""Helpers more than one core test module uses; test modules never import each other, so what
two of them share lives here (or in ``hookrun.testing`` when plugin authors need it too)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from hookrun import hookimpl
from hookrun.config import file as cfg
from hookrun.errors import ConfigError
from hookrun.testing import forked

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits" / "config.yaml"


def hookrun_script() -> str:
    """The console script installed next to this interpreter (not a shell shim)."""
    beside = Path(sys.executable).parent / "hookrun"
    return str(beside) if beside.exists() else shutil.which("hookrun") or "hookrun"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKRUN_") and k != "RANK"}
    env.update(extra)
    return env


def run(*args: object, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """``hookrun ARGS`` in a process of its own, forked from a server with torch imported
    (:mod:`hookrun.testing.forked`): the CLI as a user runs it, without its second of start-up."""
    return forked.run(
        [hookrun_script(), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(**env),
        timeout=600,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


class Tagged:
    """Records its tag at before_train and after_train_iter and returns it as its result."""

    def __init__(self, tag, log, priority=None):
        self.name = tag
        self.log = log
        if priority is not None:
            self.priority = priority

    @hookimpl
    def before_train(self):
        self.log.append(self.name)
        return self.name

    @hookimpl
    def after_train_iter(self):
        self.log.append(self.name)
        return self.name


def errors_of(config: Path, *overrides: str) -> list[str]:
    """The lines ``config validate`` would print (in-process); [] when valid."""
    try:
        cfg.load(config, overrides)
    except ConfigError as exc:
        return exc.lines
    return []

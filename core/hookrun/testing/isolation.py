"""Isolation and environments: only named plugins load, no network, real distributions
and virtual environments, so a test sees what an installed user would and nothing more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest


def isolated_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with only named plugins loading, for subprocesses."""
    env = dict(os.environ if base is None else base)
    env.pop("HOOKRUN_DISABLE_PLUGINS", None)
    env["HOOKRUN_PLUGINS_AUTOLOAD"] = "0"
    return env


@pytest.fixture
def hookrun_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the plugins a test names load: other installed plugins stay out of its runs."""
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
    monkeypatch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)


_NETWORK_GUARD = """
import socket

_connect = socket.socket.connect


def _refuse(self, address):
    if isinstance(address, tuple):  # an internet address; local (unix) sockets stay open
        with open({log!r}, "a") as log:
            log.write(repr(address) + "\\n")
        raise ConnectionRefusedError(f"no network in this test (connect to {{address}})")
    return _connect(self, address)


socket.socket.connect = _refuse
"""


def network_guard_env(env: Mapping[str, str], folder: Path) -> tuple[dict[str, str], Path]:
    """``env`` for a subprocess in which every connection to an internet address fails and
    is recorded, one line each, in the returned log file (absent when nothing tried): a
    ``sitecustomize`` module in ``folder`` put first on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "connections.log"
    (folder / "sitecustomize.py").write_text(_NETWORK_GUARD.format(log=str(log)))
    guarded = dict(env)
    guarded["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return guarded, log


def train_without_network(
    config: str | Path, cwd: str | Path, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """``hookrun train CONFIG`` in a subprocess (in ``cwd``, with ``env``) whose internet
    connections fail (:func:`network_guard_env`); asserts it exits 0 and tried none."""
    guarded, connections = network_guard_env(env, Path(cwd) / "guard")
    proc = subprocess.run(
        [sys.executable, "-m", "hookrun", "train", str(config)],
        cwd=cwd,
        env=guarded,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not connections.exists(), connections.read_text()  # nothing dialled out
    return proc


def jsonl_series(path: str | Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key`` in a JSONL log (the ``jsonl`` writer's): a reference to
    compare another writer's store with."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return [(row["step"], row[key]) for row in rows if key in row]


@pytest.fixture
def hookrun_one_thread() -> Iterator[None]:
    """One intra-op thread for the test: tiny models run faster and steadier on shared CPUs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """Install a real distribution (module + dist-info with entry points) on a temp path.

    ``make_dist(dist, module, source, entry_points)`` writes ``module.py`` from ``source`` and
    a dist-info declaring ``entry_points`` (``{group: {name: "module:attr"}}``); the path is
    on ``sys.path`` for this test only, so ``importlib.metadata`` finds it like a pip install.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def make(dist: str, module: str, source: str, entry_points: dict[str, dict[str, str]]) -> Path:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {value}" for name, value in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        return site

    return make


def layered_venv(folder: str | Path, with_pip: bool = False) -> Path:
    """A new virtual environment in ``folder`` that sees this one's packages; returns its python.

    ``python -m pip install`` there (``--no-deps --no-build-isolation``: seconds) puts a real
    distribution beside hookrun without touching the running environment, which other tests
    (and pytest-xdist workers) share. This environment's console scripts are not in its
    ``bin``: run ``python -m hookrun``. ``with_pip`` gives it its own pip and ``pip`` script
    (a few seconds more), for commands that call ``pip`` by name."""
    folder = Path(folder)
    without = [] if with_pip else ["--without-pip"]
    subprocess.run([sys.executable, "-m", "venv", *without, str(folder)], check=True)
    (site_packages,) = folder.glob("lib/python*/site-packages")
    here = sysconfig.get_paths()["purelib"]
    (site_packages / "_layered_on.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return folder / "bin" / "python"

"""Fixtures and helpers for testing hookrun plugins: a pytest plugin (entry point ``pytest11``).

pytest loads this module into every session where hookrun is installed, so importing it
changes nothing: no autouse fixture, no environment change, no torch import (helpers import
torch when called). A test opts in by asking for a fixture; docs/testing.md lists them all.
``python -m hookrun.testing WORK_DIR OPTIONS_JSON`` runs :func:`resume_job` (the harness's
subprocess).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
import pytest

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from hookrun.plugin import Plugin
    from hookrun.runner import Runner

_hookimpl = pluggy.HookimplMarker("hookrun")
"""The same marker as ``hookrun.hookimpl``, without importing hookrun's plugin machinery."""

INTERNAL_MODULES = (
    "runner",
    "data",
    "steps",
    "checkpoint",
    "manager",
    "state",
    "resume",
    "lifecycle",
    "loops",
)
"""``hookrun.<name>`` modules a plugin must not import: the runner surface replaces them."""


def pytest_configure(config: pytest.Config) -> None:
    """The ``timing`` marker: a test asserting wall-clock durations (sleeps, deadlines), which
    a busy neighbour can break; ``nox -s tests`` runs these alone after the parallel part."""
    config.addinivalue_line(
        "markers", "timing: asserts wall-clock durations; run without parallel neighbours"
    )


# -- isolation -------------------------------------------------------------------------------


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


# -- a tiny task -----------------------------------------------------------------------------


def toy_data(n: int = 12, batch_size: int = 4, shuffle: bool = True, seed: int = 0) -> DataLoader:
    """``n`` samples of 4 features and a 2-class label, the same for the same ``seed``."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def toy_model(batch_norm: bool = False) -> torch.nn.Module:
    """``nn.Linear(4, 2)``, or a small MLP with a BatchNorm layer (for BN-aware plugins)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if not batch_norm:
        return nn.Linear(4, 2)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def two_loss_model() -> torch.nn.Module:
    """A classifier for ``toy_data`` whose ``training_step`` returns three loss terms,
    ``"loss"`` (back-propagated) first, then ``"ce"`` and ``"l2"``, and whose
    ``validation_step`` reports ``loss`` and ``accuracy``: for tests of what a run reports."""
    import torch
    from torch import nn

    class TwoLossModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch: Any) -> dict[str, torch.Tensor]:
            x, y = batch
            ce = nn.functional.cross_entropy(self.net(x), y)
            l2 = torch.stack([(p**2).sum() for p in self.net.parameters()]).sum() * 1e-3
            return {"loss": ce + l2, "ce": ce, "l2": l2}

        def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
            x, y = batch
            out = self.net(x)
            loss = nn.functional.cross_entropy(out, y)
            return {"loss": loss, "accuracy": (out.argmax(1) == y).float()}

    torch.manual_seed(0)
    return TwoLossModel()


class LossRecorder:
    """An ad-hoc hook keeping every iteration's raw loss terms (``after_train_iter``'s
    ``outputs``), to check what a run reports against means computed independently."""

    def __init__(self) -> None:
        self.raw: list[dict[str, torch.Tensor]] = []

    @_hookimpl
    def after_train_iter(self, outputs: dict[str, torch.Tensor]) -> None:
        self.raw.append(dict(outputs))

    def mean(self, name: str, first: int, last: int) -> float:
        """Mean of ``name`` over iterations ``first+1 .. last`` (1-based, inclusive)."""
        values = [r[name].item() for r in self.raw[max(0, first) : last]]
        return sum(values) / len(values)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose arg-max is the target."""
    return (outputs.argmax(1) == targets).float().mean()


def toy_runner_kwargs(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """Runner keyword arguments: 2 epochs x 3 batches of toy data, SGD, accuracy, no writers.

    ``overrides`` replace any of them; the optimizer follows an overridden ``model``.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = overrides["model"] if "model" in overrides else toy_model()
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=toy_data(12, 4),
        val_dataloader=toy_data(8, 4, shuffle=False, seed=1),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        max_epochs=2,
        work_dir=Path(tmp_path) / "run",
        writers=(),
    )
    kwargs.update(overrides)
    return kwargs


@pytest.fixture
def make_toy_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A factory: ``make_toy_runner(plugins=None, **overrides)`` is a Runner over the toy task
    working in ``tmp_path / "run"`` (see :func:`toy_runner_kwargs`)."""
    from hookrun import Runner

    def make(plugins: Mapping[str, Any] | None = None, **overrides: Any) -> Runner:
        return Runner(**toy_runner_kwargs(tmp_path, plugins=plugins, **overrides))

    return make


TOY_TASK_SOURCE = """
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import hookimpl


class Pause:
    \"\"\"Holds the run in before_train until <folder>/go exists (at most a minute).\"\"\"

    def __init__(self, folder):
        self.folder = Path(folder)

    @hookimpl
    def before_train(self, runner):
        (self.folder / "started").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not (self.folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)


def build(n=32, width=2, optimizer=True, pause_dir=None, fail_in_forward=False):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))
    model = nn.Linear(4, width)
    if fail_in_forward:
        model.forward = explode
    objects = {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=8),
        "val_dataloader": DataLoader(data, batch_size=8),
        "test_dataloader": DataLoader(data, batch_size=8),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        "hooks": [Pause(pause_dir)] if pause_dir else [],
    }
    if optimizer:
        objects["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1)
    return objects


def explode(x):
    raise ValueError("user code broke here")


def wrong_keys():
    return {"modle": nn.Linear(1, 1)}


def a_string_model():
    return {"model": "resnet"}
"""
"""The task file of CLI tests (``toytask.py``): ``build`` gives a linear model on 32 random
samples in batches of 8; ``width`` changes the model's shape, ``optimizer=False`` leaves the
optimizer to the config, ``pause_dir`` holds the run in ``before_train`` until
``<pause_dir>/go`` exists, ``fail_in_forward`` raises in user code. ``wrong_keys`` and
``a_string_model`` return what a task must not."""


def write_toy_task(folder: str | Path, config: str = "", name: str = "toy.yaml") -> Path:
    """Write ``toytask.py`` (:data:`TOY_TASK_SOURCE`) and a config running it into ``folder``;
    returns the config's path. ``config`` is YAML text; the default is 2 epochs on the CPU,
    the JSONL writer and only the checkpoint plugin."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toytask.py").write_text(TOY_TASK_SOURCE)
    text = config or (
        "task: toytask.py:build\n"
        "runner: {max_epochs: 2, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: true, logger: false, timer: false}\n"
    )
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``hookrun ARGS`` in this process (no interpreter start, torch already imported): the
    exit code, stdout and stderr, as a subprocess would give them."""
    from hookrun.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


# -- comparing states ------------------------------------------------------------------------


def tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested state (dicts, lists, tuples), by ``/``-separated path."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}/{i}")


def assert_states_equal(left: Any, right: Any, path: str = "state") -> None:
    """Two nested states are equal: same keys and lengths, tensors equal bit for bit (dtype and
    shape too), floats equal or both NaN, everything else ``==``; the message names the path."""
    import torch

    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        assert isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor), path
        assert left.dtype == right.dtype, f"{path}: dtype {left.dtype} != {right.dtype}"
        assert left.shape == right.shape, f"{path}: shape {left.shape} != {right.shape}"
        assert torch.equal(left, right) or (
            left.is_floating_point() and torch.equal(left.isnan(), right.isnan())
            and torch.equal(left.nan_to_num(), right.nan_to_num())
        ), f"{path}: values differ"  # fmt: skip
    elif isinstance(left, Mapping):
        assert isinstance(right, Mapping), f"{path}: {type(right).__name__} is not a mapping"
        assert list(left) == list(right), f"{path}: keys {list(left)} != {list(right)}"
        for key in left:
            assert_states_equal(left[key], right[key], f"{path}[{key!r}]")
    elif isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple)), f"{path}: {type(right).__name__} is no sequence"
        assert len(left) == len(right), f"{path}: length {len(left)} != {len(right)}"
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_states_equal(a, b, f"{path}[{i}]")
    elif isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        assert math.isnan(right), f"{path}: nan != {right}"
    else:
        assert left == right, f"{path}: {left!r} != {right!r}"


def assert_same_checkpoint(
    a: str | Path, b: str | Path, min_tensors: int = 10, plugins: Iterable[str] = ()
) -> None:
    """Two checkpoint files hold the same training state: every tensor (weights, optimizer,
    RNGs, plugin tensors) bit for bit, the loop position, the scheduler and the iteration;
    the whole state of each plugin in ``plugins`` too (others may hold timings)."""
    import torch

    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    left_t, right_t = dict(tensors(left)), dict(tensors(right))
    assert left_t.keys() == right_t.keys()
    assert len(left_t) > min_tensors, f"only {len(left_t)} tensors in {a}"
    for key, value in left_t.items():
        assert torch.equal(value, right_t[key]), key
    assert left["loop"] == right["loop"]
    assert (left["meta"]["epoch"], left["meta"]["iter"]) == (
        right["meta"]["epoch"],
        right["meta"]["iter"],
    )
    assert left.get("scheduler") == right.get("scheduler")
    for name in plugins:
        assert_states_equal(left["plugins"][name], right["plugins"][name], f"plugins[{name!r}]")


# -- the kill-and-resume harness -------------------------------------------------------------


class NoisyData:
    """A map-style dataset drawing from the torch, numpy and python generators on every
    fetch (augmentation), so an exact resume must restore all three."""

    def __init__(self, n: int, features: int = 8, classes: int = 3) -> None:
        import torch

        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, features, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import random

        import numpy as np
        import torch

        x = self.x[i] + 0.1 * torch.randn(self.x.shape[1])
        x = x + float(np.random.normal(0, 0.05))
        if random.random() < 0.5:
            x = x.flip(0)
        return x, self.y[i]


def resume_task_kwargs(
    work_dir: str | Path, workers: int = 0, batch_norm: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Runner keyword arguments of a task with every state a resume must restore: RNG
    augmentation (:class:`NoisyData`), dropout, AdamW moments, a StepLR schedule; 3 epochs of
    7 batches (40 samples, batch 6), validation each epoch, a JSONL log, seed 7. With
    ``batch_norm`` a BatchNorm layer follows the first linear one (for precise-BN)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    norm: list[nn.Module] = [nn.BatchNorm1d(16)] if batch_norm else []
    model = nn.Sequential(nn.Linear(8, 16), *norm, nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    data: Dataset = NoisyData(40)  # type: ignore[assignment]
    val: Dataset = NoisyData(12)  # type: ignore[assignment]
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=DataLoader(data, batch_size=6, shuffle=True, num_workers=workers),
        val_dataloader=DataLoader(val, batch_size=6),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        max_epochs=3,
        work_dir=str(work_dir),
        writers=("jsonl",),
        seed=7,
    )
    kwargs.update(overrides)
    return kwargs


class KillAt:
    """Ad-hoc hook: SIGKILLs this process once ``iters`` iterations ran, i.e. as iteration
    ``iters`` (0-based) is about to start, after every hook of the iterations before it
    (saves, validation) finished. ``None`` or a negative number: never."""

    priority = 0  # before any other before_train_iter

    def __init__(self, iters: int | None) -> None:
        self.iters = iters

    @_hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if self.iters is not None and self.iters >= 0 and runner.iter == self.iters:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAt:
    """Ad-hoc hook: sends the signal ``name`` to this process, or with ``group`` to its whole
    process group (DataLoader workers included, as SLURM and torchrun do), from hook point
    ``hook`` (``after_train_iter`` or ``after_val_iter``) once ``iters`` iterations ran."""

    priority = 0

    def __init__(self, hook: str, iters: int, name: str = "SIGTERM", group: bool = False):
        self.hook, self.iters, self.group = hook, iters, group
        self.signum = signal.Signals[name]
        self.sent = False

    def _maybe_send(self, hook: str, done: int) -> None:
        if hook == self.hook and done == self.iters and not self.sent:
            self.sent = True
            if self.group:
                os.killpg(os.getpgid(0), self.signum)
            else:
                os.kill(os.getpid(), self.signum)

    @_hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self._maybe_send("after_train_iter", runner.iter + 1)

    @_hookimpl
    def after_val_iter(self, runner: Any) -> None:
        self._maybe_send("after_val_iter", runner.iter)


class RaiseAt:
    """Ad-hoc hook: raises ``RuntimeError`` as iteration ``iters`` (0-based) is about to
    start: a run that fails in a hook, for what writers and plugins do on failure."""

    def __init__(self, iters: int) -> None:
        self.iters = iters

    @_hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == self.iters:
            raise RuntimeError(f"RaiseAt: failing at iteration {self.iters}")


def toy_task(raise_at: int | None = None) -> dict[str, Any]:
    """The toy task as a task callable for configs (``task: hookrun.testing:toy_task``):
    :func:`toy_runner_kwargs`'s objects with a test loader; ``raise_at``: see :class:`RaiseAt`."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = toy_model()
    return {
        "model": model,
        "train_dataloader": toy_data(12, 4),
        "val_dataloader": toy_data(8, 4, shuffle=False, seed=1),
        "test_dataloader": toy_data(8, 4, shuffle=False, seed=2),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": accuracy},
        "hooks": [] if raise_at is None else [RaiseAt(raise_at)],
    }


class SaveEvery:
    """Ad-hoc hook: ``iter_<n>.pt`` every ``interval`` iterations and ``epoch_<n>.pt`` at each
    epoch end (when ``epochs``) in the checkpoint folder, after the other iteration hooks."""

    def __init__(self, interval: int, epochs: bool = True, priority: int = 90) -> None:
        self.interval, self.epochs, self.priority = interval, epochs, priority

    @_hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if self.interval and runner.every_n_iters(self.interval):
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{runner.iter + 1}.pt")

    @_hookimpl
    def after_train_epoch(self, runner: Any) -> None:
        if self.epochs:
            runner.save_checkpoint(runner.checkpoint_dir / f"epoch_{runner.epoch + 1}.pt")


def resume_job(
    work_dir: str | Path,
    plugins: Mapping[str, Any] | None = None,
    kill_at: int | None = None,
    resume: bool = False,
    workers: int = 0,
    save_every: int = 2,
    signal_at: Mapping[str, Any] | None = None,
    batch_norm: bool = False,
    **overrides: Any,
) -> Runner:
    """Train the resume task (:func:`resume_task_kwargs`) with ``plugins`` in this process,
    saving every ``save_every`` iterations and each epoch (:class:`SaveEvery`), SIGKILLed
    once ``kill_at`` iterations ran (:class:`KillAt`); ``resume=True`` continues from the
    newest checkpoint; ``signal_at`` holds :class:`SignalAt`'s arguments; ``batch_norm``
    goes to :func:`resume_task_kwargs`. Writes
    ``work_dir/final.pt`` at the end and returns the runner.
    Sets one intra-op thread (restore it when calling this inside a test process)."""
    import torch

    from hookrun import Runner

    torch.set_num_threads(1)  # the same arithmetic in every process, whatever its threads
    hooks = [SaveEvery(save_every), KillAt(kill_at), *overrides.pop("hooks", ())]
    if signal_at is not None:
        hooks.append(SignalAt(**signal_at))
    kwargs = resume_task_kwargs(
        work_dir, workers, batch_norm, plugins=dict(plugins or {}), hooks=hooks
    )
    kwargs.update(overrides)
    runner = Runner(**kwargs)
    runner.train(resume="auto" if resume else None)
    runner.save_checkpoint(Path(work_dir) / "final.pt")
    return runner


def train_reference(work_dir: str | Path, **options: Any) -> Path:
    """:func:`resume_job` never interrupted, in this process: the code the harness's
    subprocesses run, without their second of torch start-up; returns its ``final.pt``.
    Only named plugins load; the intra-op thread count is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
            patch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)
            resume_job(work_dir, **options)
    finally:
        torch.set_num_threads(threads)
    return Path(work_dir) / "final.pt"


def run_job(
    command: Iterable[str | Path],
    expect: int = 0,
    timeout: float = 240,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (a Python script or module after ``sys.executable``) in a fresh process
    with only named plugins loading; assert its exit status is ``expect`` (``-signal.SIGKILL``
    for a killed job) and return it with its captured output. ``new_session``: in its own
    process group, which it may signal as a whole."""
    proc = subprocess.run(
        [sys.executable, *map(str, command)],
        env=isolated_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=new_session,
    )
    assert proc.returncode == expect, (
        f"exit status {proc.returncode}, expected {expect}\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-3000:]}"
    )
    return proc


def once_per_session(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    fill: Callable[[Path], object],
) -> Path:
    """The folder ``name`` that ``fill`` fills once per test session, shared by every
    pytest-xdist worker (a file lock; pytest-xdist's recipe): an expensive job (a torchrun
    launch) that several tests read runs once, not once per worker. ``fill`` must leave the
    folder complete or raise; tests must not change it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if hasattr(request.config, "workerinput") else base
    folder = root / name
    done = root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            folder.mkdir(exist_ok=True)
            fill(folder)
            done.touch()
    return folder


def free_port() -> int:
    """A TCP port free on this host now (for ``MASTER_PORT``)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    script: str | Path,
    *args: str | Path,
    world_size: int = 2,
    timeout: float = 120,
    path: Iterable[str | Path] = (),
) -> list[str]:
    """Run ``python SCRIPT ARGS`` as the ``world_size`` ranks of one torch.distributed job set
    up by the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, a free ``MASTER_PORT``),
    without torchrun; only named plugins load, one intra-op thread each, ``path`` folders
    put first on ``PYTHONPATH``. Asserts every rank exits 0; returns each rank's output."""
    env = isolated_env()
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE=str(world_size))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), *filter(None, [env.get("PYTHONPATH")])])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]
    try:
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    statuses = [proc.returncode for proc in procs]
    assert statuses == [0] * world_size, f"exit statuses {statuses}\n" + "\n".join(outputs)
    return outputs


def run_resume_job(
    work_dir: str | Path, expect: int = 0, timeout: float = 240, **options: Any
) -> subprocess.CompletedProcess[str]:
    """:func:`resume_job` with JSON-able ``options`` in a fresh process (``python -m
    hookrun.testing``), through :func:`run_job`; in its own process group when it signals
    the group."""
    command = ["-m", "hookrun.testing", str(work_dir), json.dumps(options)]
    group = bool((options.get("signal_at") or {}).get("group"))
    return run_job(command, expect=expect, timeout=timeout, new_session=group)


def check_kill_and_resume(
    tmp_path: str | Path,
    kill_at: int | Sequence[int] = 11,
    reference: str | Path | None = None,
    exact_plugins: Iterable[str] = (),
    **options: Any,
) -> Path:
    """The kill-and-resume test: a run SIGKILLed once ``kill_at`` iterations ran (a chain:
    once each of a sequence of iteration counts, resuming with ``resume="auto"`` after each
    kill), resumed to the end, ends with the same state as a run never interrupted
    (:func:`assert_same_checkpoint`; ``exact_plugins`` also compare whole plugin states).

    ``options`` go to :func:`resume_job` (``plugins``, ``workers``, ``save_every``, ...);
    ``reference`` is an uninterrupted run's ``final.pt`` (trained in this process by
    :func:`train_reference` when not given). Returns the resumed run's work dir.
    """
    tmp_path = Path(tmp_path)
    if reference is None:
        reference = train_reference(tmp_path / "reference", **options)
    crashed = tmp_path / "crashed"
    kills = [kill_at] if isinstance(kill_at, int) else list(kill_at)
    for number, kill in enumerate(kills):
        run_resume_job(crashed, expect=-signal.SIGKILL, kill_at=kill, resume=number > 0, **options)
        assert not (crashed / "final.pt").exists()
    run_resume_job(crashed, resume=True, **options)
    assert_same_checkpoint(reference, crashed / "final.pt", plugins=exact_plugins)
    return crashed


@pytest.fixture
def kill_and_resume(tmp_path: Path) -> Callable[..., Path]:
    """:func:`check_kill_and_resume` working in this test's ``tmp_path``."""

    def check(**options: Any) -> Path:
        return check_kill_and_resume(tmp_path, **options)

    return check


# -- plugin conformance ----------------------------------------------------------------------


def plugin_class(name: str) -> type[Plugin[Any]]:
    """The installed plugin class registered as ``name`` in the ``hookrun.plugins`` group."""
    from hookrun.discovery import installed_plugins

    found = installed_plugins()
    assert name in found, f"no installed plugin {name!r} (installed: {sorted(found)})"
    cls: type[Plugin[Any]] = found[name].entry_point.load()
    return cls


def check_settings_described(name: str) -> None:
    """Every settings field has a non-empty ``description``."""
    fields = plugin_class(name).Settings.model_fields
    missing = [f for f, info in fields.items() if not (info.description or "").strip()]
    assert not missing, f"{name}: settings without a description: {missing}"


def check_docs_page(name: str, page: str | Path) -> None:
    """The plugin's documentation page exists and mentions every settings field by name."""
    page = Path(page)
    assert page.is_file(), f"{name}: no documentation page {page}"
    text = page.read_text(encoding="utf-8")
    fields = plugin_class(name).Settings.model_fields
    missing = [f for f in fields if f not in text]
    assert not missing, f"{name}: {page} does not mention {missing}"


def check_default_settings(name: str) -> None:
    """``Settings()`` constructs, and the plugin constructs from it."""
    cls = plugin_class(name)
    settings = cls.Settings()
    assert cls(settings).settings == settings


def _train_alone(name: str, tmp_path: Path) -> Runner:
    """A toy run (with a BatchNorm layer) with only ``name`` enabled, at default settings."""
    from hookrun import Runner

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
        patch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)
        kwargs = toy_runner_kwargs(Path(tmp_path), model=toy_model(batch_norm=True))
        runner = Runner(**kwargs, plugins={name: {}})
        runner.train()
    return runner


def check_works_alone(name: str, tmp_path: str | Path) -> None:
    """A run with only this plugin enabled (autoload off) trains to the end."""
    runner = _train_alone(name, Path(tmp_path))
    assert list(runner.plugins) == [name]
    assert (runner.epoch, runner.iter) == (2, 6), "the run stopped early"


def check_state_round_trip(name: str, tmp_path: str | Path) -> None:
    """The plugin's state survives a real checkpoint file: saved after a toy run, loaded with
    ``weights_only=True``, given to a fresh instance, which reports the same state."""
    import torch

    cls = plugin_class(name)
    if not (hasattr(cls, "state_dict") and hasattr(cls, "load_state_dict")):
        pytest.skip(f"{name} keeps no state")
    runner = _train_alone(name, Path(tmp_path))
    path = runner.save_checkpoint(Path(tmp_path) / "conformance.pt")
    saved = torch.load(path, weights_only=True)["plugins"][name]
    fresh: Any = cls(cls.Settings())  # state_dict/load_state_dict are optional, so untyped
    fresh.load_state_dict(saved)
    assert_states_equal(fresh.state_dict(), saved, f"{name}.state_dict()")


def plugin_source_files(name: str) -> list[Path]:
    """The ``.py`` files of the package that holds the plugin (found without importing it)."""
    from hookrun.discovery import installed_plugins

    top = installed_plugins()[name].value.split(":")[0].split(".")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None, f"{name}: cannot find package {top!r}"
    if spec.submodule_search_locations:
        return sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.py"))
    return [Path(spec.origin)] if spec.origin else []


def internal_imports(source: str) -> list[str]:
    """The ``hookrun.<internal>`` modules a Python source imports, in any spelling."""
    found = []
    internal = {f"hookrun.{m}" for m in INTERNAL_MODULES}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if len(parts) >= 2 and ".".join(parts[:2]) in internal:
                found.append(f"line {node.lineno}: {'.'.join(parts[:2])}")
    return sorted(set(found))


def check_no_internal_imports(name: str) -> None:
    """The plugin's package imports nothing from hookrun's internals (runner, data, steps,
    checkpoint, manager, state): the runner surface and ``hookrun``'s exports are its API."""
    problems = [
        f"{path}: {hit}"
        for path in plugin_source_files(name)
        for hit in internal_imports(path.read_text(encoding="utf-8"))
    ]
    assert not problems, f"{name} imports hookrun internals:\n" + "\n".join(problems)


CONFORMANCE_CHECKS: dict[str, Callable[..., None]] = {
    "settings_described": lambda name, tmp_path, docs_page: check_settings_described(name),
    "docs_page": lambda name, tmp_path, docs_page: check_docs_page(name, docs_page),
    "default_settings": lambda name, tmp_path, docs_page: check_default_settings(name),
    "state_round_trip": lambda name, tmp_path, docs_page: check_state_round_trip(name, tmp_path),
    "works_alone": lambda name, tmp_path, docs_page: check_works_alone(name, tmp_path),
    "no_internal_imports": lambda name, tmp_path, docs_page: check_no_internal_imports(name),
}
"""Every conformance check by name, each called as ``check(name, tmp_path, docs_page)``."""


def check_plugin_conformance(
    name: str, tmp_path: str | Path, docs_page: str | Path | None = None
) -> None:
    """Run every conformance check on the installed plugin ``name``; the docs page check only
    when ``docs_page`` is given. The first failing check fails the test."""
    for check, run in CONFORMANCE_CHECKS.items():
        if check == "docs_page" and docs_page is None:
            continue
        if check == "state_round_trip":
            cls = plugin_class(name)
            if not (hasattr(cls, "state_dict") and hasattr(cls, "load_state_dict")):
                continue
        run(name, Path(tmp_path) / check, docs_page)


def _main(argv: Sequence[str]) -> None:
    """The harness's subprocess. A ``KeyboardInterrupt`` (a re-delivered SIGINT) ends it by
    SIGINT itself: Python means to, but torch's exit hook ``dump_compile_times`` makes the
    interpreter exit 1 instead when ``tabulate`` is installed."""
    try:
        resume_job(argv[1], **json.loads(argv[2]))
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    _main(sys.argv)

"""The kill-and-resume harness (a task with every state a resume restores, ad-hoc hooks
that kill, signal, fail or save, the job in a fresh process) and jobs run as several ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hookrun.testing import forked
from hookrun.testing.isolation import isolated_env
from hookrun.testing.states import assert_same_checkpoint
from hookrun.testing.task import _hookimpl, accuracy, toy_data, toy_model

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from hookrun.engine.runner import Runner


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
    """Run ``command`` (a Python script or module after ``sys.executable``) in a process of its
    own (forked from a server with torch imported: :mod:`hookrun.testing.forked`) with only
    named plugins loading; assert its exit status is ``expect`` (``-signal.SIGKILL``
    for a killed job) and return it with its captured output. ``new_session``: in its own
    process group, which it may signal as a whole."""
    proc = forked.run(
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
    if path:
        env["PYTHONPATH"] = os.pathsep.join(
            [*map(str, path), *filter(None, [env.get("PYTHONPATH")])]
        )
    procs = [
        forked.spawn(
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

"""Every run ends, with real processes and real signals: loader workers that ignore the stop
signals do not keep a finished process alive, a stop that cannot be honoured at an iteration
boundary ends the process by its signal after ``dist_timeout``, and a run cut short by a
signal its shell told it to ignore still ends by that signal, never with 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookrun.testing import forked, isolated_env

TASK = '''
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import hookimpl


class At:
    """After iteration ``at`` (0-based): notes the time in ``reached``, then ``loop`` spins
    in Python, ``sleep`` sleeps in C, a signal name sends that signal to this process. Notes
    the end of the run in ``ended``; ``ignored_at_start`` names the stop signals the process
    started with ignored."""

    def __init__(self, folder, at, action):
        self.folder, self.at, self.action = Path(folder), at, action

    @hookimpl
    def after_train_iter(self, runner):
        if runner.iter != self.at:
            return
        (self.folder / "reached").write_text(repr(time.time()))
        if self.action == "loop":
            while True:
                pass
        if self.action == "sleep":
            time.sleep(3600)
        if self.action.startswith("SIG"):
            os.kill(os.getpid(), signal.Signals[self.action])

    @hookimpl
    def after_run(self, runner):
        (self.folder / "ended").write_text(repr(time.time()))


class Stalls(TensorDataset):
    """A fetch sleeps for an hour once this copy of the dataset (each worker has its own)
    served ``stall_after`` samples: a worker stuck in a fetch, whatever the machine's load."""

    def __init__(self, stall_after, *tensors):
        super().__init__(*tensors)
        self.stall_after, self.served = stall_after, 0

    def __getitem__(self, index):
        if self.stall_after is not None and self.served >= self.stall_after:
            time.sleep(3600)
        self.served += 1
        return super().__getitem__(index)


def build(folder, at=-1, action="", workers=0, persistent=False, stall_after=None):
    names = ("SIGINT", "SIGTERM")
    ignored = [n for n in names if signal.getsignal(signal.Signals[n]) == signal.SIG_IGN]
    (Path(folder) / "ignored_at_start").write_text(" ".join(ignored))
    g = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)
    data = Stalls(stall_after, inputs, labels)
    model = nn.Linear(4, 2)
    options = dict(batch_size=4, num_workers=workers, persistent_workers=persistent)
    return {
        "model": model,
        "train_dataloader": DataLoader(data, shuffle=True, **options),
        "val_dataloader": DataLoader(TensorDataset(*data.tensors), **options),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": nn.CrossEntropyLoss(),
        "hooks": [At(folder, at, action)],
    }
'''


def write_task(
    folder: Path, epochs: int | None, runner: str = "writers: []", **task_args: object
) -> Path:
    """``stoptask.py`` and a config training it for ``epochs`` epochs of 16 iterations in
    ``folder`` (None: ``runner`` says how long); ``runner`` adds runner settings (YAML
    flow-mapping entries; no writers unless it names them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stoptask.py").write_text(TASK)
    args = ", ".join(
        f"{key}: {value!r}" for key, value in {"folder": str(folder), **task_args}.items()
    )
    length = "" if epochs is None else f"max_epochs: {epochs}, "
    config = folder / "run.yaml"
    config.write_text(
        "task: stoptask.py:build\n"
        f"task_args: {{{args}}}\n"
        f"runner: {{{length}device: cpu, {runner}}}\n"
        "plugins: {}\n"
    )
    return config


def hookrun_train(config: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hookrun",
        "train",
        str(config),
        "--work-dir",
        str(config.parent / "run"),
    ]


def start_train(config: Path) -> subprocess.Popen[str]:
    """``hookrun train`` of ``config`` in its own process group, its output captured."""
    return forked.spawn(
        hookrun_train(config),
        env=isolated_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def ends_within(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc``'s output once it ends; a failure naming what it printed when it is still
    running after ``timeout`` s (its whole group killed: loader workers hold its pipes)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running after {timeout} s\n{out[-2000:]}\n{err[-2000:]}")


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"ended early with {proc.returncode}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path.name} not written in {timeout} s"
        time.sleep(0.05)


@pytest.mark.timing
def test_persistent_loader_workers_let_the_process_exit_once_training_ends(
    tmp_path: Path,
) -> None:
    """The workers ignore SIGTERM (a group SIGTERM is a preemption, not a worker failure),
    so multiprocessing's exit-time SIGTERM cannot end them: the process used to wait for
    them forever. Plain PyTorch with the same loaders exits within a second or two."""
    config = write_task(tmp_path, epochs=2, workers=2, persistent=True)
    proc = start_train(config)
    out, err = ends_within(proc, 120)
    exited = time.time()
    assert proc.returncode == 0, err[-3000:]
    ended = float((tmp_path / "ended").read_text())
    assert exited - ended < 10, exited - ended  # after_run, writers, summary, exit
    assert "Traceback" not in err


@pytest.mark.timing
def test_a_loader_worker_stuck_in_a_fetch_when_the_run_ends_does_not_keep_it_alive(
    tmp_path: Path,
) -> None:
    """The run ends at ``max_iters`` while both workers sleep in a fetch for the next batches:
    they would never answer torch's shutdown nor the SIGTERM they ignore; hookrun kills them
    at exit, so the process ends at once instead of waiting for them forever. Batches go to
    the two workers in turn, so each serves 3 of the 6 batches the run needs (12 samples)
    and sleeps in its 4th, a batch fetched ahead that the run never takes."""
    config = write_task(
        tmp_path,
        epochs=None,
        runner="max_iters: 6, writers: []",
        workers=2,
        persistent=True,
        stall_after=12,
    )
    proc = start_train(config)
    out, err = ends_within(proc, 120)
    exited = time.time()
    assert proc.returncode == 0, err[-3000:]
    ended = float((tmp_path / "ended").read_text())
    assert exited - ended < 10, exited - ended


@pytest.mark.timing
@pytest.mark.parametrize("action", ["loop", "sleep"])
def test_sigterm_to_a_process_stuck_in_an_iteration_ends_it_after_dist_timeout(
    tmp_path: Path, action: str
) -> None:
    """A step or hook that never returns (spinning in Python, or in a C call) never reaches
    the iteration boundary where the stop would save: the process ends by the signal once
    ``dist_timeout`` passed without an iteration, with one line saying why."""
    config = write_task(
        tmp_path, epochs=50, runner="dist_timeout: 3, writers: []", at=2, action=action
    )
    proc = start_train(config)
    try:
        wait_for(tmp_path / "reached", proc)
        time.sleep(0.5)  # inside the stuck hook
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), (proc.returncode, err)
    assert 3 <= elapsed < 3 + 5, elapsed
    assert err.strip() == (
        "hookrun: SIGTERM received, no iteration ended in 3 s: ending without a checkpoint"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "ended").exists()


@pytest.mark.parametrize(
    ("name", "shell"),
    [
        ("SIGINT", '"$0" "$@" & wait $!'),  # a non-interactive shell's `cmd &` ignores SIGINT
        ("SIGTERM", 'trap "" TERM; "$0" "$@" & wait $!'),
    ],
)
def test_a_run_cut_short_by_a_signal_started_ignored_ends_by_it(
    tmp_path: Path, name: str, shell: str
) -> None:
    """The signal is in ``stop_signals``, so it stops the run (a save, "stopping") even
    though the process started with it ignored; the process then ends by that signal (130,
    143), not with 0 after 5 of 6,400 iterations. The default writers close on the way
    (TensorBoard's run status for a stopped run once ended it with a traceback, exit 1)."""
    writers = "writers: [jsonl, tensorboard], log_interval: 2"  # a report before the stop
    config = write_task(tmp_path, epochs=400, runner=writers, at=4, action=name)
    proc = forked.run(
        ["sh", "-c", shell, *hookrun_train(config)],
        env=isolated_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert name in (tmp_path / "ignored_at_start").read_text().split()
    assert proc.returncode == 128 + signal.Signals[name], (proc.returncode, proc.stderr)
    saved = tmp_path / "run" / "checkpoints" / "stop_iter_5.pt"
    assert f"{name} received: saved {saved}; stopping" in proc.stderr
    assert saved.is_file()

"""Pipes and stops (DESIGN §12): stop, interrupt and error lines go to stderr; a closed pipe
(`hookrun train CONFIG | head -n 1`) stops the run as SIGPIPE would, quietly, with its exit
code; Ctrl-C under `| tee` (SIGINT to the whole group, tee included) saves, says so on
stderr and ends with 130. Real processes, real pipes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _support import clean_env, hookrun_script, write
from hookrun.testing import run_cli

TASK = """
import time

import torch
from torch import nn
from torch.utils.data import DataLoader


class Slow(nn.Linear):
    def __init__(self):
        super().__init__(4, 1)

    def forward(self, x):
        time.sleep(0.01)
        return super().forward(x)


def build():
    torch.manual_seed(0)
    model = Slow()
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    loader = DataLoader([(x[i:i + 4], y[i:i + 4]) for i in range(0, 32, 4)], batch_size=None)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "train_dataloader": loader, "criterion": nn.MSELoss()}
"""


def start(tmp_path: Path) -> subprocess.Popen[str]:
    """``hookrun train`` of a run far longer than the test (a line every iteration), in
    a process group of its own (as a shell's pipeline is), its output to a pipe."""
    write(tmp_path / "slow.py", TASK)
    config = write(
        tmp_path / "slow.yaml",
        "task: slow.py:build\n"
        "runner: {max_epochs: 1000, device: cpu, log_interval: 1, writers: [jsonl]}\n"
        "plugins: {checkpoint: {interval: 1000}, logger: {interval: 1}}\n",
    )
    return subprocess.Popen(
        [hookrun_script(), "train", config, "--work-dir", tmp_path / "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        process_group=0,
    )


def ended(proc: subprocess.Popen[str]) -> str:
    """The process's stderr once it ended (killed, and the test failed, after two minutes)."""
    try:
        return proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running: {proc.communicate()[1]}")


def stop_line(stderr: str, name: str) -> Path:
    """The file the stop's line on stderr names, checked to exist."""
    lines = [line for line in stderr.splitlines() if f"{name} received: saved" in line]
    assert len(lines) == 1, stderr
    saved = Path(lines[0].split("saved ", 1)[1].removesuffix("; stopping"))
    assert lines[0] == f"[hookrun] {name} received: saved {saved}; stopping"
    assert saved.is_file(), saved
    return saved


def test_a_closed_pipe_stops_the_run_quietly_with_sigpipes_code(tmp_path: Path) -> None:
    proc = start(tmp_path)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # `| head -n 1`
    proc.stdout.close()
    stderr = ended(proc)
    assert first.startswith("[hookrun] building task slow.py:build")
    assert proc.returncode == 128 + signal.SIGPIPE, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    saved = stop_line(stderr, "SIGPIPE")
    assert saved.parent == tmp_path / "run" / "checkpoints"


def test_ctrl_c_under_tee_saves_says_so_on_stderr_and_ends_with_130(tmp_path: Path) -> None:
    proc = start(tmp_path)
    assert proc.stdout is not None
    tee = subprocess.Popen(
        ["tee", tmp_path / "out.txt"],
        stdin=proc.stdout,
        stdout=subprocess.DEVNULL,
        process_group=proc.pid,  # the terminal's foreground group: both get the Ctrl-C
    )
    proc.stdout.close()
    log = tmp_path / "run" / "log.jsonl"
    deadline = time.monotonic() + 120
    while not (log.is_file() and '"step"' in log.read_text()):  # training has started
        assert proc.poll() is None and time.monotonic() < deadline, ended(proc)
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stderr = ended(proc)
    assert tee.wait(timeout=60) == -signal.SIGINT  # the pipe's reader is gone
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    stop_line(stderr, "SIGINT")
    assert stderr.splitlines()[-1] == "interrupted"
    assert "building task" in (tmp_path / "out.txt").read_text()  # stdout went to tee


def test_top_level_help_lists_the_exit_codes_of_signals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    codes = " ".join(out[out.index("Exit codes:") :].split())
    for part in ("0 success", "1 training failed", "2 a mistake", "130 Ctrl-C", "143 SIGTERM"):
        assert part in codes, codes

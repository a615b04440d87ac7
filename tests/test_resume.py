"""Exact resume: SIGKILL mid-epoch, resume="auto", bit-identical final state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hookrun import Runner
from hookrun.errors import CheckpointError

JOB = Path(__file__).with_name("resume_job.py")


def run_job(work_dir: Path, workers: int, kill_at: int = -1, resume: bool = False) -> int:
    cmd = [sys.executable, str(JOB), str(work_dir), str(workers), str(kill_at)]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0"}
    proc = subprocess.run(
        cmd + (["--resume"] if resume else []), env=env, capture_output=True, text=True, timeout=240
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr)
    return proc.returncode


def tensors(obj, prefix=""):
    """Every tensor of a nested checkpoint, by path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}/{i}")


def assert_identical(a: Path, b: Path) -> None:
    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    left_t, right_t = dict(tensors(left)), dict(tensors(right))
    assert left_t.keys() == right_t.keys()
    assert len(left_t) > 10
    for key, value in left_t.items():
        assert torch.equal(value, right_t[key]), key
    assert left["loop"] == right["loop"]
    assert left.get("scheduler") == right.get("scheduler")


@pytest.mark.parametrize("workers", [0, 2])
def test_sigkill_mid_epoch_then_resume_auto_is_bit_identical(tmp_path, workers):
    reference = tmp_path / "reference"
    assert run_job(reference, workers) == 0
    crashed = tmp_path / "crashed"
    # 40 samples / batch 6 = 7 batches per epoch: iteration 10 is mid-epoch 1 and the
    # newest checkpoint (iter_10) was written just before the kill.
    assert run_job(crashed, workers, kill_at=10) == -signal.SIGKILL
    assert not (crashed / "final.pt").exists()
    assert (crashed / "checkpoints" / "iter_10.pt").exists()
    assert run_job(crashed, workers, resume=True) == 0
    assert_identical(reference / "final.pt", crashed / "final.pt")


def test_kill_between_checkpoints_resumes_from_the_last_one(tmp_path):
    reference = tmp_path / "reference"
    assert run_job(reference, 0) == 0
    crashed = tmp_path / "crashed"
    assert run_job(crashed, 0, kill_at=16) == -signal.SIGKILL  # after iter_16, before iter_18
    assert run_job(crashed, 0, resume=True) == 0
    assert_identical(reference / "final.pt", crashed / "final.pt")
    log = (crashed / "log.jsonl").read_text()
    assert log.count('"val/loss"') == 3  # 2 validations before the kill, 1 after the resume


def test_checkpoint_loads_with_weights_only(tmp_path):
    assert run_job(tmp_path, 0) == 0
    checkpoint = torch.load(tmp_path / "final.pt", weights_only=True)
    assert checkpoint["format"] == "hookrun/1"
    assert set(checkpoint["meta"]) == {"hookrun_version", "epoch", "iter", "time", "world_size"}
    assert checkpoint["meta"]["iter"] == 21 and checkpoint["meta"]["epoch"] == 3
    assert set(checkpoint["rng"]) >= {"python", "numpy", "torch", "cuda"}


def test_truncated_newest_checkpoint_is_named_and_skipped(tmp_path):
    assert run_job(tmp_path, 0, kill_at=10) == -signal.SIGKILL
    newest = tmp_path / "checkpoints" / "iter_10.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0"}
    proc = subprocess.run(
        [sys.executable, str(JOB), str(tmp_path), "0", "-1", "--resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"skipping checkpoint {newest}: cannot be loaded" in proc.stdout
    assert "resumed from" in proc.stdout and "iter_8.pt" in proc.stdout


def test_resume_from_missing_path_is_a_clear_error(tmp_path):
    from hookrun_testutil import toy_runner_kwargs

    runner = Runner(**toy_runner_kwargs(tmp_path))
    with pytest.raises(CheckpointError, match="checkpoint not found: .*nope.pt"):
        runner.train(resume=tmp_path / "nope.pt")

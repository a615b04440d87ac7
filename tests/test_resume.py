"""Exact resume: SIGKILL mid-epoch, resume="auto", bit-identical final state (through the
kill-and-resume harness of ``hookrun.testing``)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch

from hookrun import Runner
from hookrun.errors import CheckpointMismatchError
from hookrun.testing import (
    assert_same_checkpoint,
    check_kill_and_resume,
    once_per_session,
    run_resume_job,
    toy_runner_kwargs,
)

# The resume task: 40 samples / batch 6 = 7 iterations per epoch, 3 epochs, iter_<n>.pt every
# 2 iterations and epoch_<n>.pt at each epoch end.


@pytest.fixture
def reference(resume_reference: Path) -> Path:
    """The uninterrupted run's final.pt (conftest's, shared with test_lifecycle.py)."""
    return resume_reference / "final.pt"


@pytest.fixture
def killed_at_11(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run SIGKILLed as iteration 11 (mid-epoch 1) starts, just after iter_10.pt was
    written; once per session: each test resumes its own copy."""

    def kill(folder: Path) -> None:
        run_resume_job(folder, expect=-signal.SIGKILL, kill_at=11)
        assert not (folder / "final.pt").exists()

    return once_per_session(request, tmp_path_factory, "killed_at_11", kill)


def test_sigkill_mid_epoch_then_resume_auto_is_bit_identical(tmp_path, reference, killed_at_11):
    # loader workers, whose augmentation RNGs must be restored too: test_kill_chains.py
    crashed = shutil.copytree(killed_at_11, tmp_path / "crashed")
    assert (crashed / "checkpoints" / "iter_10.pt").exists()
    run_resume_job(crashed, resume=True)
    assert_same_checkpoint(reference, crashed / "final.pt")


def test_kill_between_checkpoints_resumes_from_the_last_one(tmp_path, reference):
    # killed after iter_16 was saved, before iter_18
    crashed = check_kill_and_resume(tmp_path, kill_at=17, reference=reference)
    log = (crashed / "log.jsonl").read_text()
    assert log.count('"val/loss"') == 3  # 2 validations before the kill, 1 after the resume


def test_checkpoint_loads_with_weights_only(reference):
    checkpoint = torch.load(reference, weights_only=True)
    assert checkpoint["format"] == "hookrun/1"
    meta = {"hookrun_version", "epoch", "iter", "time", "world_size", "optimizers"}
    assert set(checkpoint["meta"]) == meta and checkpoint["meta"]["optimizers"] == {"main": "AdamW"}
    assert checkpoint["meta"]["iter"] == 21 and checkpoint["meta"]["epoch"] == 3
    assert set(checkpoint["rng"]) >= {"python", "numpy", "torch", "cuda"}


def test_truncated_newest_checkpoint_is_named_and_skipped(tmp_path, reference, killed_at_11):
    crashed = shutil.copytree(killed_at_11, tmp_path / "crashed")
    newest = crashed / "checkpoints" / "iter_10.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    proc = run_resume_job(crashed, resume=True)
    assert f"skipping checkpoint {newest}: cannot be loaded" in proc.stdout
    assert "resumed from" in proc.stdout and "iter_8.pt" in proc.stdout
    assert_same_checkpoint(reference, crashed / "final.pt")  # from iter_8.pt, as exactly


def test_resume_from_missing_path_is_a_clear_error(tmp_path):
    runner = Runner(**toy_runner_kwargs(tmp_path))
    with pytest.raises(CheckpointMismatchError, match="checkpoint not found: .*nope.pt"):
        runner.train(resume=tmp_path / "nope.pt")

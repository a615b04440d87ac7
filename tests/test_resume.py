"""Exact resume: SIGKILL mid-epoch, resume="auto", bit-identical final state (through the
kill-and-resume harness of ``hookrun.testing``)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch

from hookrun import Runner, hookimpl
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


class SaveInsideGroup:
    """Saves ``runner.save_checkpoint`` at one hook point of one iteration: inside an
    accumulation group, where the group's gradients so far are not in the weights yet."""

    def __init__(self, hook: str, at: int, path: Path) -> None:
        self.hook, self.at, self.path = hook, at, path

    def save(self, runner: Runner) -> None:
        if runner.iter == self.at:
            runner.save_checkpoint(self.path)

    @hookimpl
    def before_train_iter(self, runner: Runner) -> None:
        if self.hook == "before_train_iter":
            self.save(runner)

    @hookimpl
    def after_train_iter(self, runner: Runner) -> None:
        if self.hook == "after_train_iter":
            self.save(runner)


@pytest.mark.parametrize(
    ("hook", "at"),
    [("after_train_iter", 0), ("before_train_iter", 1), ("after_train_iter", 3)],
)
def test_a_save_inside_an_accumulation_group_resumes_bit_identical(tmp_path, hook, at):
    """DESIGN §3: a checkpoint taken inside a group keeps its partial gradients. Groups of
    2 over epochs of 3 batches; saved after the group's first batch (or before its second),
    resumed in a new Runner, the run ends with the uninterrupted run's weights, bit for bit."""
    path = tmp_path / "inside.pt"
    saver = SaveInsideGroup(hook, at, path)
    kwargs = toy_runner_kwargs(tmp_path / "whole", grad_accum=2, hooks=[saver], max_epochs=3)
    whole = Runner(**kwargs)
    whole.train()
    assert "accumulation" in torch.load(path, weights_only=True)
    resumed = Runner(**toy_runner_kwargs(tmp_path / "resumed", grad_accum=2, max_epochs=3))
    resumed.train(resume=path)
    for name, value in whole.unwrapped_model.state_dict().items():
        assert torch.equal(value, resumed.unwrapped_model.state_dict()[name]), name


def test_a_save_at_a_group_boundary_holds_no_gradients(tmp_path):
    """After the group's step there is nothing partial to keep: the file stays as it was."""
    path = tmp_path / "boundary.pt"
    kwargs = toy_runner_kwargs(
        tmp_path, grad_accum=2, hooks=[SaveInsideGroup("after_train_iter", 1, path)]
    )
    Runner(**kwargs).train()
    assert "accumulation" not in torch.load(path, weights_only=True)

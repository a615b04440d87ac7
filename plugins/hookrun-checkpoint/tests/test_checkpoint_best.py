"""Best bookkeeping survives failures and resumes: a failed best save changes nothing, a best
file is only ever replaced by a better score, and the file a run resumed from stays as it is.

ScriptedModel's validation reports ``accuracy = scores[completed epochs - 1]``; the runs have
4 iterations per epoch and save ``epoch_<N>.pt`` after each epoch, before its validation."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_testing import EpochTeller

from hookrun import CheckpointError, hookimpl
from hookrun.testing import forked


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def best_of(path: Path, metric: str = "accuracy") -> dict[str, Any]:
    """The best entry of ``metric`` that the checkpoint ``path`` records."""
    return torch.load(path, weights_only=True)["plugins"]["checkpoint"]["best"][metric]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Squat:
    """Before the checkpoint plugin sees validation ``epoch``, moves ``best_accuracy.pt`` to
    ``aside`` and puts a folder of that name in its place: writing the best file fails for
    real (``os.replace`` onto a folder), as root too."""

    priority = 50

    def __init__(self, epoch: int, aside: Path) -> None:
        self.epoch, self.aside = epoch, aside

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        if runner.epoch == self.epoch:
            best = runner.checkpoint_dir / "best_accuracy.pt"
            os.replace(best, self.aside)
            best.mkdir()


class Raiser:
    """Raises as iteration ``at`` (0-based) starts."""

    def __init__(self, at: int) -> None:
        self.at = at

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            raise RuntimeError("boom")


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_best_save_changes_nothing_and_a_later_improvement_is_saved(
    make_runner: Callable, tmp_path: Path, async_save: bool
) -> None:
    settings = {"save_best": "accuracy", "async_save": async_save}
    scores = (0.5, 0.9, 0.7, 0.8)
    aside = tmp_path / "aside.pt"
    # epoch 1: best 0.5 saved; epoch 2: saving 0.9 fails. Synchronously the run stops there;
    # in the background the failure surfaces at the next wait: here an exception in epoch 3,
    # whose emergency checkpoint must not claim the 0.9 that no file holds
    hooks = [EpochTeller(), Squat(2, aside)] + ([Raiser(9)] if async_save else [])
    runner = make_runner(settings, scores, hooks=hooks)
    out = runner.checkpoint_dir
    failure = f"cannot write checkpoint {out / 'best_accuracy.pt'}: Is a directory"
    with pytest.raises((RuntimeError, CheckpointError)) as raised:
        runner.train()
    if async_save:
        assert str(raised.value) == "boom"
        assert failure in runner.console.file.getvalue()
        assert (out / "latest").read_text() == "emergency_iter_9.pt\n"
        assert best_of(out / "emergency_iter_9.pt")["score"] == 0.5
    else:
        assert isinstance(raised.value, CheckpointError) and str(raised.value) == failure
        assert (out / "latest").read_text() == "epoch_2.pt\n"
    assert best_of(aside)["score"] == 0.5
    (out / "best_accuracy.pt").rmdir()
    os.replace(aside, out / "best_accuracy.pt")  # the disk is fine again

    runner = make_runner(settings, scores, max_epochs=4)
    runner.train(resume="auto")
    best = best_of(out / "best_accuracy.pt")
    if async_save:  # resumed in epoch 3: 0.7, then 0.8, beat the 0.5 best_accuracy.pt holds
        assert (best["score"], best["epoch"]) == (pytest.approx(0.8), 4)
    else:  # resumed before epoch 2's validation, which finds 0.9 again and saves it now
        assert (best["score"], best["epoch"]) == (pytest.approx(0.9), 2)


def test_better_best_file_of_an_abandoned_timeline_is_not_replaced_by_a_worse_score(
    make_runner: Callable,
) -> None:
    settings = {"save_best": "accuracy"}
    runner = make_runner(settings, (0.5, 0.6, 0.95))
    runner.train()
    out = runner.checkpoint_dir
    assert best_of(out / "best_accuracy.pt")["score"] == pytest.approx(0.95)
    assert best_of(out / "epoch_2.pt")["score"] == pytest.approx(0.5)  # its bookkeeping
    kept = digest(out / "best_accuracy.pt")

    # back to epoch 2: its bookkeeping knows 0.5; the file holds 0.95 of the abandoned epoch 3
    new_timeline = (0.5, 0.6, 0.91, 0.93, 0.97)
    runner = make_runner(settings, new_timeline, max_epochs=4)
    runner.train(resume=out / "epoch_2.pt")
    assert digest(out / "best_accuracy.pt") == kept  # 0.6, 0.91 and 0.93 are not better
    assert (
        "checkpoint: best_accuracy.pt holds the best accuracy so far, 0.95: only a better one "
        "replaces it" in runner.console.file.getvalue()
    )
    assert best_of(out / "epoch_4.pt")["score"] == pytest.approx(0.95)

    runner = make_runner(settings, new_timeline, max_epochs=5)
    runner.train(resume="auto")
    best = best_of(out / "best_accuracy.pt")
    assert (best["score"], best["epoch"]) == (pytest.approx(0.97), 5)


def test_resumed_from_best_file_is_never_written(make_runner: Callable) -> None:
    settings = {"save_best": "accuracy"}
    runner = make_runner(settings, (0.5, 0.9), max_epochs=2)
    runner.train()
    out = runner.checkpoint_dir
    resumed_from = digest(out / "best_accuracy.pt")

    # epoch 3: 0.6; epoch 4: 0.95 and epoch 5: 0.97 are new bests, written beside it
    scores = (0.5, 0.9, 0.6, 0.95, 0.97, 0.99)
    runner = make_runner(settings, scores, max_epochs=5)
    runner.train(resume=out / "best_accuracy.pt")
    assert digest(out / "best_accuracy.pt") == resumed_from
    # the run's second new best replaced its first (best_accuracy.iter_16.pt)
    assert files(out) == {
        *(f"epoch_{n}.pt" for n in range(1, 6)),
        "best_accuracy.pt",
        "best_accuracy.iter_20.pt",
        "latest",
    }
    assert (out / "latest").read_text() == "best_accuracy.iter_20.pt\n"
    best = best_of(out / "best_accuracy.iter_20.pt")
    assert (best["score"], best["file"], best["epoch"]) == (
        pytest.approx(0.97),
        "best_accuracy.iter_20.pt",
        5,
    )

    # a run resumed from that file writes its new bests to best_accuracy.pt again
    runner = make_runner(settings, scores, max_epochs=6)
    runner.train(resume="auto")
    assert runner.resumed_from == out / "best_accuracy.iter_20.pt"
    best = best_of(out / "best_accuracy.pt")
    assert (best["score"], best["file"], best["epoch"]) == (
        pytest.approx(0.99),
        "best_accuracy.pt",
        6,
    )
    assert (out / "best_accuracy.iter_20.pt").is_file()  # it was this run's resume point


BEST_JOB = Path(__file__).parent / "jobs" / "best_job.py"


def best_job(work_dir: Path, expect: int, **options: Any) -> subprocess.CompletedProcess[str]:
    """``best_job.py`` in a process of its own; its exit code must be ``expect``."""
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "PYTHONPATH": str(BEST_JOB.parent.parent)}
    command = [sys.executable, str(BEST_JOB), str(work_dir), json.dumps(options)]
    done = forked.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == expect, done.stderr
    return done


@pytest.mark.parametrize("async_save", [False, True])
def test_best_save_refused_by_a_hook_claims_nothing_and_the_resumed_run_saves_its_next_best(
    tmp_path: Path, async_save: bool
) -> None:
    scores = (0.5, 0.9, 0.7, 0.8)
    # epoch 1 saves best 0.5; a user hook raises in the best save of epoch 2's 0.9
    failed = best_job(tmp_path, 1, scores=scores, max_epochs=4, async_save=async_save, refuse_at=2)
    assert "RuntimeError: user hook refuses the best checkpoint" in failed.stderr
    out = tmp_path / "checkpoints"
    kinds = {"epoch_1.pt", "epoch_2.pt", "best_accuracy.pt", "emergency_iter_8.pt", "latest"}
    assert files(out) == kinds
    assert (out / "latest").read_text() == "emergency_iter_8.pt\n"
    on_disk = best_of(out / "best_accuracy.pt")
    assert (on_disk["score"], on_disk["epoch"]) == (0.5, 1)
    # the emergency checkpoint's bookkeeping names the best that is on disk, not 0.9
    assert best_of(out / "emergency_iter_8.pt") == on_disk

    resumed = best_job(tmp_path, 0, scores=scores, max_epochs=4, async_save=async_save, resume=True)
    assert "resumed from" in resumed.stdout and "emergency_iter_8.pt" in resumed.stdout
    assert "holds the best accuracy so far" not in resumed.stdout  # nothing to correct
    # 0.7 beats 0.5, not 0.9: one line names the file and the new best
    assert re.search(
        r"checkpoint: (saved|writing) best_accuracy\.pt( in the background)? "
        r"\(new best accuracy 0\.7\)",
        resumed.stdout,
    )
    best = best_of(out / "best_accuracy.pt")
    assert (best["score"], best["epoch"], best["iter"]) == (pytest.approx(0.8), 4, 16)

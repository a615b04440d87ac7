"""Schedules whose state holds a ``collections.Counter`` (``MultiStepLR``'s milestones, also
nested in ``SequentialLR`` and ``ChainedScheduler``) are saved, loaded with
``weights_only=True`` and resumed mid-run to the same learning rate, iteration for iteration,
as a run never interrupted; through the Runner and through ``hookrun train``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler

from hookrun import Runner, hookimpl
from hookrun.testing import run_cli, toy_runner_kwargs, write_toy_task

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

BASE = 0.1


class LrRecorder:
    """The learning rate each training iteration steps with, by 0-based iteration."""

    def __init__(self) -> None:
        self.lrs: dict[int, float] = {}

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        self.lrs[runner.iter] = runner.optimizer.param_groups[0]["lr"]


class SaveAt:
    """Saves ``iter_<n>.pt`` once ``n`` iterations ran (mid-epoch for the toy task)."""

    def __init__(self, iters: int) -> None:
        self.iters = iters

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.iters:
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{self.iters}.pt")


def schedule(kind: str, optimizer: torch.optim.Optimizer) -> Any:
    if kind == "multistep":
        return lr_scheduler.MultiStepLR(optimizer, milestones=[4, 7, 7], gamma=0.5)
    if kind == "warmup+multistep":
        warm = lr_scheduler.LinearLR(optimizer, start_factor=0.25, total_iters=3)
        main = lr_scheduler.MultiStepLR(optimizer, milestones=[3, 6], gamma=0.5)
        return lr_scheduler.SequentialLR(optimizer, [warm, main], milestones=[3])
    main = lr_scheduler.MultiStepLR(optimizer, milestones=[5], gamma=0.5)
    return lr_scheduler.ChainedScheduler([main, lr_scheduler.ExponentialLR(optimizer, 0.9)])


def expected(kind: str, i: int) -> float:
    """Iteration ``i``'s learning rate from the schedules' definitions, not torch's classes
    (a repeated milestone multiplies by gamma once per repetition)."""
    if kind == "multistep":
        return BASE * 0.5 ** sum(m <= i for m in (4, 7, 7))
    if kind == "warmup+multistep":
        if i < 3:
            return BASE * (0.25 + 0.75 * i / 3)
        return BASE * 0.5 ** sum(m <= i - 3 for m in (3, 6))
    return BASE * 0.5 ** (i >= 5) * 0.9**i


def train(tmp_path: Path, kind: str, resume: Path | None = None) -> dict[int, float]:
    """12 iterations (4 epochs of 3 batches), the schedule stepping per iteration; the
    uninterrupted run saves after 5 iterations, in the middle of the second epoch."""
    recorder = LrRecorder()
    kwargs = toy_runner_kwargs(tmp_path, max_epochs=4, scheduler_interval="iter")
    kwargs["optimizer"] = torch.optim.SGD(kwargs["model"].parameters(), lr=BASE)
    kwargs["scheduler"] = schedule(kind, kwargs["optimizer"])
    kwargs["hooks"] = [recorder] if resume else [recorder, SaveAt(5)]
    if resume:
        kwargs["work_dir"] = tmp_path / "resumed"
    Runner(**kwargs).train(resume=resume)
    return recorder.lrs


@pytest.mark.parametrize("kind", ["multistep", "warmup+multistep", "chained"])
def test_counter_milestones_resume_mid_run(tmp_path, kind):
    whole = train(tmp_path, kind)
    assert list(whole) == list(range(12))
    assert [whole[i] for i in range(12)] == pytest.approx([expected(kind, i) for i in range(12)])

    path = tmp_path / "run" / "checkpoints" / "iter_5.pt"
    saved = torch.load(path, weights_only=True)["schedulers"]["main"]  # the loader hookrun uses
    milestones = saved.get("milestones") or next(
        s["milestones"] for s in saved["_schedulers"] if "milestones" in s
    )
    assert isinstance(milestones, Counter)

    resumed = train(tmp_path, kind, resume=path)
    assert list(resumed) == list(range(5, 12))  # the 5 iterations done are not replayed
    assert resumed == {i: whole[i] for i in range(5, 12)}  # exact, not approximately


CONFIG = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {max_epochs: 3, device: cpu, writers: [jsonl], log_interval: 1}
optimizer: {type: SGD, lr: 0.1}
scheduler:
  warmup: {iters: 2, start_factor: 0.5}
  main: {type: MultiStepLR, milestones: [3, 6], gamma: 0.1}
  interval: iter
plugins: {checkpoint: true, logger: false, timer: false}
"""


def logged_lrs(work_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (work_dir / "log.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/lr"] for row in rows if "train/lr" in row}


def test_train_cli_saves_and_resumes_a_multistep_schedule(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_toy_task(tmp_path, CONFIG)
    code, _, err = run_cli(capsys, "train", config)
    assert code == 0, err
    whole = logged_lrs(tmp_path / "runs" / "exp")
    assert sorted(whole) == list(range(1, 13))  # 3 epochs of 4 batches
    # warm-up 0.05 -> 0.1 over 2 steps, then x0.1 at the main schedule's steps 3 and 6
    assert [whole[s] for s in (1, 2, 3, 5, 6, 8, 9, 12)] == pytest.approx(
        [0.05, 0.075, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    )

    first = tmp_path / "runs" / "exp" / "checkpoints" / "epoch_1.pt"
    code, out, err = run_cli(capsys, "train", config, "--resume", first, "--work-dir", "again")
    assert code == 0, err
    assert logged_lrs(tmp_path / "again") == {s: whole[s] for s in range(5, 13)}

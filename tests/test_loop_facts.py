"""The loop's facts have one home, the position (``runner.position``): whether an iteration
closes an accumulation group, the optimizer steps taken, and the default run length.

With 7 batches per epoch and ``grad_accum=3`` each epoch's groups are its batches 1-3, 4-6
and 7 (the epoch's last batch closes a short group): 3 optimizer steps an epoch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun import Runner, hookimpl
from hookrun.testing import (
    forked,
    isolated_env,
    jsonl_series,
    run_cli,
    toy_data,
    toy_model,
    toy_runner_kwargs,
    write_toy_task,
)

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

PER_EPOCH, ACCUM, EPOCHS = 7, 3, 2


def hand_count() -> list[tuple[int, bool, int]]:
    """(iteration, closes a group, optimizer steps after it), counted batch by batch."""
    rows, steps = [], 0
    for epoch in range(EPOCHS):
        in_group = 0
        for batch in range(PER_EPOCH):
            in_group += 1
            closes = in_group == ACCUM or batch == PER_EPOCH - 1
            if closes:
                steps, in_group = steps + 1, 0
            rows.append((epoch * PER_EPOCH + batch, closes, steps))
    return rows


class FactRecorder:
    """The position's facts as a plugin sees them, at the end of each iteration and inside
    each ``after_optimizer_step``; ``veto`` refuses every step (``before_optimizer_step``)."""

    def __init__(self, veto: bool = False) -> None:
        self.iters: list[tuple[int, bool, int]] = []
        self.steps: list[tuple[int, int]] = []
        self.before: list[bool] = []
        self.veto = veto

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        self.before.append(runner.position.closes_group)

    @hookimpl
    def before_optimizer_step(self, runner: Any) -> bool:
        return not self.veto

    @hookimpl
    def after_optimizer_step(self, runner: Any) -> None:
        self.steps.append((runner.iter, runner.position.optimizer_steps.get("main", 0)))

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        pos = runner.position
        self.iters.append((runner.iter, pos.closes_group, pos.optimizer_steps.get("main", 0)))


def accumulating(tmp_path: Path, *hooks: object, **overrides: Any) -> Runner:
    kwargs = toy_runner_kwargs(
        tmp_path,
        train_dataloader=toy_data(PER_EPOCH * 2, 2),
        max_epochs=EPOCHS,
        grad_accum=ACCUM,
        device="cpu",
        hooks=list(hooks),
    )
    kwargs.update(overrides)
    return Runner(**kwargs)


def test_the_position_counts_groups_and_steps_as_a_hand_count_does(tmp_path: Path) -> None:
    rec = FactRecorder()
    runner = accumulating(tmp_path, rec)
    runner.train()
    expected = hand_count()
    assert rec.iters == expected
    assert rec.before == [closes for _, closes, _ in expected]  # known before the iteration
    # inside after_optimizer_step the count holds the step just taken
    assert rec.steps == [(i, steps) for i, closes, steps in expected if closes]
    assert runner.position.optimizer_steps == {"main": 3 * EPOCHS}


def test_a_vetoed_step_is_counted_as_the_schedule_counts_it(tmp_path: Path) -> None:
    """No weight changes, and the count still goes up at every group's end."""
    rec = FactRecorder(veto=True)
    runner = accumulating(tmp_path, rec)
    before = {k: v.clone() for k, v in runner.unwrapped_model.state_dict().items()}
    runner.train()
    after = runner.unwrapped_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert rec.steps == []  # after_optimizer_step fires only for a step taken
    assert rec.iters == hand_count()


class StepsAfterIters:
    """Only ``after_train_iter``: an fp32 run without accumulation takes the inline step."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int]] = []

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self.seen.append(
            (runner.position.closes_group, runner.position.optimizer_steps.get("main", 0))
        )


def test_the_inline_step_counts_too(tmp_path: Path) -> None:
    rec = StepsAfterIters()
    accumulating(tmp_path, rec, grad_accum=1).train()
    assert rec.seen == [(True, n) for n in range(1, PER_EPOCH * EPOCHS + 1)]


class SaveAt:
    """Saves a checkpoint after iteration ``at`` (0-based)."""

    def __init__(self, at: int, path: Path) -> None:
        self.at, self.path = at, path

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            runner.save_checkpoint(self.path)


@pytest.mark.parametrize("at", [4, 6])  # inside the second group of epoch 0; at its end
def test_a_resumed_run_goes_on_with_the_facts_of_the_uninterrupted_one(
    tmp_path: Path, at: int
) -> None:
    saved = tmp_path / "mid.pt"
    accumulating(tmp_path / "first", SaveAt(at, saved)).train()
    rec = FactRecorder()
    accumulating(tmp_path / "second", rec).train(resume=saved)
    assert rec.iters == hand_count()[at + 1 :]


class DropsGradients:
    """Sets every gradient to None after each backward: nothing to step with, but no step
    is taken either until a group's end."""

    @hookimpl
    def after_backward(self, runner: Any) -> None:
        for p in runner.unwrapped_model.parameters():
            p.grad = None


class KeepsZeroGrads(torch.optim.SGD):
    """An optimizer that zeroes gradients in place instead of dropping them."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=False)


def iteration_saves(tmp_path: Path, *hooks: object, **overrides: Any) -> list[int]:
    plugins = {"checkpoint": {"by_epoch": False, "interval": 2, "save_last": False}}
    runner = accumulating(tmp_path, *hooks, plugins=plugins, **overrides)
    runner.train()
    out = runner.work_dir / "checkpoints"
    return sorted(int(p.name[5:-3]) for p in out.glob("iter_*.pt"))


@pytest.mark.parametrize("case", ["grads dropped after backward", "grads zeroed in place"])
def test_checkpoint_saves_wait_for_group_ends_whatever_the_gradients(
    tmp_path: Path, case: str
) -> None:
    """Due at every 2nd iteration; groups end at 3, 6, 7 | 10, 13, 14: a save falls at the
    end of each group holding a multiple of 2 (the short group 7 holds none). Gradients that
    are None inside a group, or zeros after a step, change nothing."""
    if case == "grads dropped after backward":
        saves = iteration_saves(tmp_path, DropsGradients())
    else:
        model = toy_model()
        saves = iteration_saves(
            tmp_path, model=model, optimizer=KeepsZeroGrads(model.parameters(), lr=0.1)
        )
    assert saves == [3, 6, 10, 13, 14]


NO_LENGTH = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {device: cpu, writers: [jsonl], log_interval: 1}
optimizer: {type: SGD, lr: 0.1}
scheduler:
  main: {type: CosineAnnealingLR, T_max: auto, eta_min: 0.001}
  interval: iter
plugins: {checkpoint: false, logger: false, timer: false}
"""


def test_schedule_and_runner_agree_on_the_default_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither ``max_epochs`` nor ``max_iters``: ``hookrun schedule`` (its own process)
    plans as many iterations, with the same rates, as the Runner then trains; a cosine over
    ``T_max: auto`` ends at its minimum only if the schedule's length is the run's."""
    monkeypatch.chdir(tmp_path)
    config = write_toy_task(tmp_path, NO_LENGTH)
    done = forked.run(
        [sys.executable, "-m", "hookrun", "schedule", str(config), "--json"],
        cwd=tmp_path,
        env=isolated_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    code, _, err = run_cli(capsys, "train", config, "--work-dir", "run")
    assert code == 0, err
    logged = dict(jsonl_series(tmp_path / "run" / "log.jsonl", "train/lr"))
    assert [row["iter"] for row in planned] == sorted(logged)
    assert len(planned) == 10 * 4  # ten epochs of the toy task's 4 batches
    assert [row["lr"][0] for row in planned] == [logged[i] for i in sorted(logged)]

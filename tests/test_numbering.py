"""Every epoch a user reads counts from 1: the console's lines, ``hookrun schedule`` (table and
``--json``) and the checkpoint files, for the same run through the real ``hookrun`` command."""

from __future__ import annotations

import json
import re

from _support import run
from hookrun import hookimpl
from hookrun.testing import load_checkpoint, write_toy_task

CONFIG = """
task: toytask.py:build
runner: {max_epochs: 3, device: cpu, writers: [jsonl], log_interval: 2}
optimizer: {type: SGD, lr: 0.1}
scheduler: {main: {type: StepLR, step_size: 1}, interval: epoch}
task_args: {optimizer: false}
plugins: {checkpoint: true, timer: false, logger: {progress: lines}}
"""


def test_console_schedule_and_checkpoints_count_epochs_from_one(tmp_path):
    config = write_toy_task(tmp_path, CONFIG)  # 3 epochs of 4 iterations
    planned = run("schedule", config, "--json")
    assert planned.returncode == 0, planned.stderr
    epochs = [row["epoch"] for row in json.loads(planned.stdout)]
    assert epochs == [1] * 4 + [2] * 4 + [3] * 4
    table = run("schedule", config)
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+\S", table.stdout, re.MULTILINE)
    column = {int(it): int(epoch) for it, epoch in rows}
    assert (column[1], column[12]) == (1, 3)  # the first and the last iteration

    work = tmp_path / "run"
    trained = run("train", config, "--work-dir", work)
    assert trained.returncode == 0, trained.stderr
    shown = re.findall(r"^epoch (\d)/3  iter (\d+)/12 ", trained.stdout, re.MULTILINE)
    assert [(int(e), int(i)) for e, i in shown] == [
        (i // 4 + (i % 4 > 0), i) for i in range(2, 13, 2)
    ]
    assert "val  epoch 1  iter 4  " in trained.stdout  # the line after the first epoch
    first = load_checkpoint(work / "checkpoints" / "epoch_1.pt")
    assert (first["meta"]["epoch"], first["meta"]["iter"]) == (1, 4)  # epoch 1, done


class EpochSeen:
    """Records ``runner.epoch`` at each hook point of an epoch and after the run."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    @hookimpl
    def before_train_epoch(self, runner):
        self.seen.append(("before_train_epoch", runner.epoch))

    @hookimpl
    def after_train_epoch(self, runner):
        self.seen.append(("after_train_epoch", runner.epoch))

    @hookimpl
    def after_val_epoch(self, runner):
        self.seen.append(("after_val_epoch", runner.epoch))


def test_runner_epoch_is_the_index_then_the_epochs_done_as_documented(make_toy_runner):
    hook = EpochSeen()
    runner = make_toy_runner(hooks=[hook], max_epochs=2)
    runner.train()
    assert hook.seen == [
        ("before_train_epoch", 0),
        ("after_train_epoch", 0),
        ("after_val_epoch", 1),
        ("before_train_epoch", 1),
        ("after_train_epoch", 1),
        ("after_val_epoch", 2),
    ]
    assert runner.epoch == 2  # after the run: the epochs done

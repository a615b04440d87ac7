"""What the console shows, through the real ``hookrun`` command: one logging knob
(``runner.log_interval`` defaults to ``plugins.logger.interval``), read back from the console,
the JSONL log and the TensorBoard files."""

from __future__ import annotations

import re
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _support import run
from hookrun.testing import jsonl_series, write_toy_task

LINE = re.compile(r"^epoch 1/1  iter (\d+)/12 ", re.MULTILINE)


def _toy(folder: Path, runner: str, logger: str) -> Path:
    """12 iterations in one epoch (96 samples in batches of 8), the console in plain lines."""
    return write_toy_task(
        folder,
        "task: toytask.py:build\n"
        "task_args: {n: 96}\n"
        f"runner: {{max_epochs: 1, device: cpu, writers: [jsonl, tensorboard]{runner}}}\n"
        f"plugins: {{checkpoint: false, timer: false, logger: {{progress: lines{logger}}}}}\n",
    )


def _tensorboard_steps(work: Path, tag: str) -> list[int]:
    events = EventAccumulator(str(work / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_the_logger_interval_alone_sets_the_reports(tmp_path):
    work = tmp_path / "run"
    done = run("train", _toy(tmp_path, "", ", interval: 2"), "--work-dir", work)
    assert done.returncode == 0, done.stderr
    every_two = [2, 4, 6, 8, 10, 12]
    assert [int(i) for i in LINE.findall(done.stdout)] == every_two
    assert [step for step, _ in jsonl_series(work / "log.jsonl", "train/loss")] == every_two
    assert _tensorboard_steps(work, "train/loss") == every_two


def test_a_console_interval_a_multiple_of_the_log_interval(tmp_path):
    work = tmp_path / "run"
    config = _toy(tmp_path, ", log_interval: 4", ", interval: 8")
    done = run("train", config, "--work-dir", work)
    assert done.returncode == 0, done.stderr
    assert [int(i) for i in LINE.findall(done.stdout)] == [8, 12]  # and after the last one
    assert _tensorboard_steps(work, "train/loss") == [4, 8, 12]


def test_a_console_interval_not_a_multiple_is_one_line_and_exit_2(tmp_path):
    work = tmp_path / "run"
    config = _toy(tmp_path, ", log_interval: 4", ", interval: 6")
    for command in (("config", "validate", config), ("train", config, "--work-dir", work)):
        refused = run(*command)
        assert refused.returncode == 2
        assert refused.stderr.splitlines() == [
            "plugins.logger.interval: 6 is not a multiple of runner.log_interval (4); "
            "lines can only be printed at the core's reports"
        ]
        assert "Traceback" not in refused.stderr
    assert not work.exists()


TINY_TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    model = nn.Linear(4, 2)
    return {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=8),
        "val_dataloader": DataLoader(data, batch_size=8),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {
            "tiny": lambda out, y: torch.tensor(1e-5),
            "big": lambda out, y: torch.tensor(2.5e6),
        },
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
    }
"""


def test_the_final_table_keeps_significant_digits(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY_TASK)
    config = write_toy_task(
        tmp_path,
        "task: tiny.py:build\n"
        "runner: {max_epochs: 1, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: false, timer: false, logger: false}\n",
    )
    done = run("train", config, "--work-dir", tmp_path / "run")
    assert done.returncode == 0, done.stderr
    summary = done.stdout[done.stdout.index("final metrics") :]
    assert re.search(r"tiny\s+│\s+1\.000e-05", summary), summary
    assert re.search(r"big\s+│\s+2\.500e\+06", summary), summary
    assert "0.0000" not in summary

"""What the console shows, through the real ``hookrun`` command: one logging knob
(``runner.log_interval`` defaults to ``plugins.logger.interval``), one number format, the
core's own lines when no plugin renders the console, one checkpoint line per save, the bar's
last frame before the end-of-training lines; read back from the console, the JSONL log and
the TensorBoard files."""

from __future__ import annotations

import math
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _support import clean_env, hookrun_script, run
from hookrun import Runner, format_number, format_scalar
from hookrun.testing import jsonl_series, toy_runner_kwargs, write_toy_task

LINE = re.compile(r"^epoch 1/1  iter (\d+)/12 .*  eta \d+:\d\d:\d\d$", re.MULTILINE)


def _toy(folder: Path, runner: str, logger: str) -> Path:
    """12 iterations in one epoch (96 samples in batches of 8), the console in plain lines."""
    return write_toy_task(
        folder,
        "task: toytask.py:build\n"
        "task_args: {n: 96}\n"
        f"runner: {{max_epochs: 1, device: cpu, writers: [jsonl, tensorboard]{runner}}}\n"
        f"plugins: {{checkpoint: false, timer: false, logger: {{progress: lines{logger}}}}}\n",
    )


def _tensorboard(work: Path) -> EventAccumulator:
    events = EventAccumulator(str(work / "tensorboard"))
    events.Reload()
    return events


def _tensorboard_steps(work: Path, tag: str) -> list[int]:
    return [event.step for event in _tensorboard(work).Scalars(tag)]


def test_the_logger_interval_alone_sets_the_reports(tmp_path):
    work = tmp_path / "run"
    done = run("train", _toy(tmp_path, "", ", interval: 2"), "--work-dir", work)
    assert done.returncode == 0, done.stderr
    every_two = [2, 4, 6, 8, 10, 12]
    assert [int(i) for i in LINE.findall(done.stdout)] == every_two  # each line ends with eta
    assert [step for step, _ in jsonl_series(work / "log.jsonl", "train/loss")] == every_two
    assert _tensorboard_steps(work, "train/loss") == every_two
    # the ETA is a moment's estimate for the console, not a series: no writer gets it
    assert "train/eta" not in (work / "log.jsonl").read_text()
    tags = _tensorboard(work).Tags()["scalars"]
    assert "train/loss" in tags and "train/eta" not in tags


def test_the_logger_interval_sets_the_reports_in_python_too(tmp_path):
    """The Runner takes the same default as a config file: no ``log_interval`` given, the
    logger's ``interval`` is the core's; given both, each keeps its own."""
    plugins = {"logger": {"interval": 2, "progress": "lines"}, "checkpoint": False}
    alone = Runner(**toy_runner_kwargs(tmp_path / "a", plugins=plugins, writers=["jsonl"]))
    assert alone.log_interval == 2
    alone.train()
    steps = [step for step, _ in jsonl_series(tmp_path / "a" / "run" / "log.jsonl", "train/loss")]
    assert steps == [2, 3, 4, 6]  # every 2 iterations and at each epoch's end (3 an epoch)
    both = Runner(**toy_runner_kwargs(tmp_path / "b", plugins=plugins, log_interval=1))
    assert both.log_interval == 1
    assert Runner(**toy_runner_kwargs(tmp_path / "c", plugins={"logger": {}})).log_interval == 10


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
    assert re.search(r"big\s+│\s+2500000 ", summary), summary  # a whole number below 1e7
    assert "0.0000" not in summary


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.0, "0"),
        (1e-5, "1.000e-05"),
        (-2.5e-4, "-2.500e-04"),
        (0.001, "0.001"),
        (0.036712, "0.03671"),
        (0.98888, "0.9889"),
        (1.0, "1"),
        (2994.43, "2994"),
        (9999.96, "10000"),  # rounds past four digits: a whole number, not 1e+04
        (123456.7, "123457"),
        (2.5e7, "2.500e+07"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
    ],
)
def test_format_number_keeps_four_significant_digits(value, shown):
    assert format_number(value) == shown


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("train/time", 0.0123, "12.3 ms"),
        ("train/data_time", 9.113e-4, "0.9113 ms"),
        ("train/throughput", 2994.43, "2994 samples/s"),
        ("train/memory", 812.3, "812 MiB"),
        ("train/eta", 3725.4, "1:02:05"),
        ("train/lr", 0.003, "3.000e-03"),
        ("train/lr/group1", 0.0001, "1.000e-04"),
        ("train/loss", 0.036712, "0.03671"),
    ],
)
def test_format_scalar_gives_the_core_scalars_units(name, value, shown):
    assert format_scalar(name, value) == shown


CORE_ONLY = (
    "task: toytask.py:build\n"
    "task_args: {n: 48}\n"  # 6 iterations an epoch
    "runner: {max_epochs: 2, log_interval: 2, device: cpu, writers: [jsonl, tensorboard]}\n"
    "plugins: {logger: false, timer: false, checkpoint: {interval: 1, save_best: accuracy}}\n"
)


@pytest.fixture(scope="module")
def core_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run without the logger plugin (two epochs of six iterations, a report every two,
    a periodic and a best checkpoint each epoch): its work dir and its console."""
    folder = tmp_path_factory.mktemp("core_only")
    done = run("train", write_toy_task(folder, CORE_ONLY), "--work-dir", folder / "run")
    assert done.returncode == 0, done.stderr
    return folder / "run", done.stdout


def test_without_a_console_plugin_the_core_prints_a_line_every_report(core_only):
    work, out = core_only
    shown = re.findall(
        r"^epoch (\d)/2  iter (\d+)/12  loss (\S+)  lr 1\.000e-01  \S+ it/s  eta \d:\d\d:\d\d$",
        out,
        re.M,
    )
    losses = jsonl_series(work / "log.jsonl", "train/loss")
    assert [int(step) for _, step, _ in shown] == [2, 4, 6, 8, 10, 12] == [s for s, _ in losses]
    assert [int(epoch) for epoch, _, _ in shown] == [1, 1, 1, 2, 2, 2]
    assert [loss for _, _, loss in shown] == [f"{loss:.4g}" for _, loss in losses]
    assert "train/eta" not in (work / "log.jsonl").read_text()
    assert "train/eta" not in _tensorboard(work).Tags()["scalars"]


def test_without_a_console_plugin_the_core_prints_one_line_per_validation_and_test(core_only):
    work, out = core_only
    log = work / "log.jsonl"
    expected = [
        f"val  epoch {epoch}  iter {step}  loss {loss:.4g}  accuracy {accuracy:.4g}"
        for epoch, (step, loss), (_, accuracy) in zip(
            (1, 2), jsonl_series(log, "val/loss"), jsonl_series(log, "val/accuracy"), strict=True
        )
    ]
    assert re.findall(r"^val  .*$", out, re.M) == expected
    (step, loss), (_, accuracy) = (
        jsonl_series(log, "test/loss")[0],
        jsonl_series(log, "test/accuracy")[0],
    )
    assert re.findall(r"^test  .*$", out, re.M) == [
        f"test  iter {step}  loss {loss:.4g}  accuracy {accuracy:.4g}"
    ]
    assert "┃" in out[out.index("final metrics") :]  # the final summary stays a table


def test_each_checkpoint_save_is_one_line_naming_its_file(core_only):
    work, out = core_only
    accuracies = [a for _, a in jsonl_series(work / "log.jsonl", "val/accuracy")]
    first = out[out.index("epoch 1/2") : out.index("epoch 2/2")]
    best = f"{accuracies[0]:.4g}"  # the first validation is always a new best
    assert re.findall(r"^.*checkpoint: .*$", first, re.M) == [
        "[hookrun] checkpoint: saved epoch_1.pt",
        f"[hookrun] checkpoint: saved best_accuracy.pt (new best accuracy {best})",
    ]
    assert (work / "checkpoints" / "epoch_1.pt").is_file()


def test_on_a_terminal_the_bar_stops_before_the_end_of_training_lines(tmp_path):
    """Through a pseudo-terminal (the progress bar is on): the timer's totals, printed in
    ``after_train``, come after the bar's last frame, and nothing redraws it after them."""
    config = write_toy_task(
        tmp_path,
        "task: toytask.py:build\n"
        "runner: {max_epochs: 2, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: false, timer: true, logger: {progress: bar}}\n",
    )
    leader, follower = pty.openpty()
    env = clean_env(TERM="xterm", COLUMNS="160")
    command = [hookrun_script(), "train", str(config), "--work-dir", "run"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode()
    totals = text.index("Overall training speed")
    assert " it/s ETA " in text[:totals]  # the bar was drawn
    assert " it/s ETA " not in text[totals:]  # and never again after the totals
    assert "\x1b[?25h" in text[:totals]  # the cursor shown again: the bar stopped first

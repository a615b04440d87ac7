"""What a real run leaves in TensorBoard and the JSONL log, read back and checked against
losses smoothed independently from the raw per-iteration values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hookrun import hookimpl


def read_tensorboard(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def scalar_records(records: list[dict[str, Any]], tag: str) -> dict[int, float]:
    return {r["step"]: r[tag] for r in records if tag in r}


def test_smoothed_losses_in_tensorboard_and_jsonl(make_runner, recorder):
    runner = make_runner({"interval": 10, "window": 7, "progress": "off"}, hooks=[recorder])
    runner.train()  # 2 epochs x 25 batches

    acc = read_tensorboard(runner.work_dir / "tensorboard")
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert set(acc.Tags()["scalars"]) == {
        "train/loss",
        "train/ce",
        "train/l2",
        "train/lr",
        "val/loss",
        "val/accuracy",
    }
    steps = [10, 20, 30, 40, 50]
    for term in ("loss", "ce", "l2"):
        expected = {s: recorder.smoothed(term, s, window=7) for s in steps}
        events = acc.Scalars(f"train/{term}")
        assert [e.step for e in events] == steps
        assert {e.step: e.value for e in events} == pytest.approx(expected, rel=1e-6)
        assert scalar_records(records, f"train/{term}") == pytest.approx(expected, rel=1e-12)
    assert scalar_records(records, "train/lr") == {s: 0.05 for s in steps}


def test_validation_metrics_are_written_once_per_validation(make_runner):
    runner = make_runner({"interval": 10, "progress": "off"})
    runner.train()
    acc = read_tensorboard(runner.work_dir / "tensorboard")
    assert [e.step for e in acc.Scalars("val/loss")] == [25, 50]
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert [r["step"] for r in records if "val/accuracy" in r] == [25, 50]


def test_config_and_plugin_table_reach_every_writer(make_runner, recorder):
    runner = make_runner({"interval": 10, "progress": "off"}, hooks=[recorder])
    runner.train()
    first = read_jsonl(runner.work_dir / "log.jsonl")[0]
    config = first["config"]
    assert config["note"] == "logger test"
    assert config["runner"] == {"max_epochs": 2}
    assert [(row["name"], row["priority"]) for row in config["active_plugins"]] == [
        ("logger", 60),
        ("LossRecorder", 100),
    ]
    assert config["active_plugins"][0]["settings"]["interval"] == 10
    acc = read_tensorboard(runner.work_dir / "tensorboard")
    assert "config/text_summary" in acc.Tags()["tensors"]


def test_learning_rates_per_group_when_they_differ(make_runner):
    torch.manual_seed(0)
    runner = make_runner({"interval": 25, "progress": "off"}, max_epochs=1)
    net = runner.unwrapped_model.net
    runner.optimizer = torch.optim.SGD(
        [{"params": net[0].parameters(), "lr": 0.1}, {"params": net[2].parameters(), "lr": 0.01}]
    )
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert scalar_records(records, "train/lr/group0") == {25: 0.1}
    assert scalar_records(records, "train/lr/group1") == {25: 0.01}
    assert not scalar_records(records, "train/lr")


def test_learning_rate_is_the_one_the_logged_iteration_trained_with(make_runner):
    runner = make_runner({"interval": 10, "progress": "off"}, scheduler_interval="iter")
    runner.scheduler = torch.optim.lr_scheduler.LambdaLR(runner.optimizer, lambda i: 1 / (i + 1))
    runner.train()  # iteration i (0-based) trains with 0.05 / (i + 1)
    records = read_jsonl(runner.work_dir / "log.jsonl")
    steps = [10, 20, 30, 40, 50]
    assert scalar_records(records, "train/lr") == pytest.approx({s: 0.05 / s for s in steps})


class FakeTimer:
    """Puts the timer's scalars as a timer plugin would, before the logger runs."""

    priority = 30

    @hookimpl
    def after_train_iter(self, runner) -> None:
        done = runner.iter + 1
        runner.scalars.put("train/time", 0.001 * done)
        runner.scalars.put("train/data_time", 0.0001 * done)
        runner.scalars.put("train/throughput", 100.0 + done)
        runner.scalars.put("train/eta", 2.0 * (runner.max_iters - done))


def test_timer_scalars_are_passed_on_as_their_latest_values(make_runner):
    runner = make_runner({"interval": 10, "progress": "off"}, hooks=[FakeTimer()])
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    steps = [10, 20, 30, 40, 50]
    assert scalar_records(records, "train/time") == pytest.approx({s: 0.001 * s for s in steps})
    assert scalar_records(records, "train/data_time") == pytest.approx(
        {s: 0.0001 * s for s in steps}
    )
    assert scalar_records(records, "train/throughput") == {s: 100.0 + s for s in steps}
    assert scalar_records(records, "train/eta") == {s: 2.0 * (50 - s) for s in steps}


def test_window_longer_than_the_scalar_store_default(make_runner, recorder):
    runner = make_runner(
        {"interval": 50, "window": 150, "progress": "off"},
        hooks=[recorder],
        max_epochs=8,
        val_dataloader=None,
    )
    runner.train()  # 200 iterations
    records = read_jsonl(runner.work_dir / "log.jsonl")
    expected = {s: recorder.smoothed("loss", s, window=150) for s in (50, 100, 150, 200)}
    assert scalar_records(records, "train/loss") == pytest.approx(expected, rel=1e-12)


class MixedScalar:
    """Another plugin's scalar, put as a tensor on even iterations and a float on odd ones."""

    @hookimpl
    def after_train_iter(self, runner) -> None:
        i = runner.iter
        runner.scalars.put("train/custom", torch.tensor(float(i)) if i % 2 == 0 else float(i))


def test_other_train_scalars_are_smoothed_too_even_when_mixed(make_runner):
    runner = make_runner({"interval": 10, "window": 4, "progress": "off"}, hooks=[MixedScalar()])
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    # the window ending at step s holds iterations s-4 .. s-1: mean s - 2.5
    assert scalar_records(records, "train/custom") == {s: s - 2.5 for s in (10, 20, 30, 40, 50)}

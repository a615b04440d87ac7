"""Training reports owned by the core: what a real run leaves in TensorBoard and
the JSONL log with no plugin at all, checked against losses averaged independently from the
raw per-iteration values."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hookrun import Runner, hookimpl
from hookrun.testing import LossRecorder, toy_data, toy_model, two_loss_model


def make_runner(tmp_path: Path, **overrides: Any) -> Runner:
    """2 epochs of 25 batches, no plugin, both built-in writers."""
    model = two_loss_model()
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=toy_data(200, 8, seed=0),
        val_dataloader=toy_data(40, 10, shuffle=False, seed=1),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        max_epochs=2,
        work_dir=tmp_path / "run",
        plugins={},
        log_interval=10,
        config={"runner": {"max_epochs": 2}, "note": "reporting test"},
    )
    kwargs.update(overrides)
    return Runner(**kwargs)


def read_tensorboard(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def scalar_records(records: list[dict[str, Any]], tag: str) -> dict[int, float]:
    return {r["step"]: r[tag] for r in records if tag in r}


REPORTS = [10, 20, 25, 30, 40, 50]  # every 10 iterations and at both epoch ends


def test_losses_averaged_since_the_last_report_without_any_plugin(tmp_path):
    recorder = LossRecorder()
    runner = make_runner(tmp_path, hooks=[recorder])
    runner.train()
    acc = read_tensorboard(runner.work_dir / "tensorboard")
    records = read_jsonl(runner.work_dir / "log.jsonl")
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/ce", "train/l2", "train/lr"} <= tags
    assert "train/eta" not in tags  # a moment's estimate for the console, not a series
    for term in ("loss", "ce", "l2"):
        expected = {
            step: recorder.mean(term, before, step)
            for before, step in zip([0, *REPORTS], REPORTS, strict=False)
        }
        events = acc.Scalars(f"train/{term}")
        assert [e.step for e in events] == REPORTS
        assert {e.step: e.value for e in events} == pytest.approx(expected, rel=1e-6)
        assert scalar_records(records, f"train/{term}") == pytest.approx(expected, rel=1e-12)
    assert scalar_records(records, "train/lr") == {s: 0.05 for s in REPORTS}
    assert not scalar_records(records, "train/eta")


def test_a_plain_single_loss_run_reports_the_means_of_a_hand_loops_losses(tmp_path):
    """The plain step (one loss, no hook reading the losses): every report's ``train/loss``
    is the float64 mean of the losses a hand loop computes over the same batches."""
    model = toy_model()
    reference = toy_model()
    data = toy_data(200, 8, shuffle=False, seed=0)
    runner = make_runner(
        tmp_path,
        model=model,
        train_dataloader=data,
        val_dataloader=None,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        criterion=torch.nn.CrossEntropyLoss(),
    )
    runner.train()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(2):
        for x, y in data:
            loss = torch.nn.functional.cross_entropy(reference(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach().double())
    expected = {
        step: float(torch.stack(losses[before:step]).mean())
        for before, step in zip([0, *REPORTS], REPORTS, strict=False)
    }
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert scalar_records(records, "train/loss") == pytest.approx(expected, rel=1e-12)


def test_a_run_shorter_than_the_interval_still_reports(tmp_path):
    runner = make_runner(tmp_path, max_epochs=None, max_iters=27, log_interval=50)
    runner.train()  # 27 iterations: epoch ends at 25, the run at 27
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert sorted(scalar_records(records, "train/loss")) == [25, 27]


def test_validation_metrics_are_written_once_per_validation(tmp_path):
    runner = make_runner(tmp_path)
    runner.train()
    acc = read_tensorboard(runner.work_dir / "tensorboard")
    assert [e.step for e in acc.Scalars("val/loss")] == [25, 50]
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert [r["step"] for r in records if "val/accuracy" in r] == [25, 50]


def test_config_and_plugin_table_reach_every_writer(tmp_path):
    early = LossRecorder()
    early.name, early.priority = "early", "HIGH"  # a priority given by name
    runner = make_runner(tmp_path, hooks=[LossRecorder(), early])
    runner.train()
    config = read_jsonl(runner.work_dir / "log.jsonl")[0]["config"]
    assert config["note"] == "reporting test"
    assert config["runner"] == {"max_epochs": 2}
    assert [(row["name"], row["priority"]) for row in config["active_plugins"]] == [
        ("early", 30),
        ("LossRecorder", 50),
    ]
    acc = read_tensorboard(runner.work_dir / "tensorboard")
    assert "config/text_summary" in acc.Tags()["tensors"]


def test_learning_rates_per_group_when_they_differ(tmp_path):
    runner = make_runner(tmp_path, max_epochs=1, log_interval=25)
    net = runner.unwrapped_model.net
    runner.optimizers = {
        "main": torch.optim.SGD(
            [
                {"params": net[0].parameters(), "lr": 0.1},
                {"params": net[2].parameters(), "lr": 0.01},
            ]
        )
    }
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert scalar_records(records, "train/lr/group0") == {25: 0.1}
    assert scalar_records(records, "train/lr/group1") == {25: 0.01}
    assert not scalar_records(records, "train/lr")


def test_learning_rate_is_the_one_the_reported_iteration_trained_with(tmp_path):
    runner = make_runner(tmp_path, scheduler_interval="iter")
    runner.schedulers = {
        "main": torch.optim.lr_scheduler.LambdaLR(runner.optimizer, lambda i: 1 / (i + 1))
    }
    runner.train()  # iteration i (0-based) trains with 0.05 / (i + 1)
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert scalar_records(records, "train/lr") == pytest.approx({s: 0.05 / s for s in REPORTS})


class Gauges:
    """Puts gauges as a timer plugin does: the report writes their latest value."""

    @hookimpl
    def after_train_iter(self, runner) -> None:
        done = runner.iter + 1
        runner.scalars.gauge("train/time", 0.001 * done)
        runner.scalars.gauge("train/throughput", 100.0 + done)


def test_gauges_are_reported_as_their_latest_values(tmp_path):
    runner = make_runner(tmp_path, hooks=[Gauges()])
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert scalar_records(records, "train/time") == pytest.approx({s: 0.001 * s for s in REPORTS})
    assert scalar_records(records, "train/throughput") == {s: 100.0 + s for s in REPORTS}


class MixedScalar:
    """A series put as a tensor on even iterations and a float on odd ones."""

    @hookimpl
    def after_train_iter(self, runner) -> None:
        i = runner.iter
        runner.scalars.put("train/custom", torch.tensor(float(i)) if i % 2 == 0 else float(i))


def test_other_series_are_averaged_too_even_when_mixed(tmp_path):
    runner = make_runner(tmp_path, hooks=[MixedScalar()])
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    # the report at step s averages iterations before+1 .. s, i.e. 0-based before .. s-1
    expected = {s: (before + s - 1) / 2 for before, s in zip([0, *REPORTS], REPORTS, strict=False)}
    assert scalar_records(records, "train/custom") == expected


def test_after_report_gets_what_the_writers_got_and_the_eta(tmp_path):
    seen: list[tuple[int, dict[str, float]]] = []

    class Peek:
        @hookimpl
        def after_report(self, scalars, step):
            seen.append((step, dict(scalars)))

    runner = make_runner(tmp_path, hooks=[Peek()])
    runner.train()
    records = read_jsonl(runner.work_dir / "log.jsonl")
    assert [step for step, _ in seen] == REPORTS
    for step, scalars in seen:
        written = {k: v for row in records if row.get("step") == step for k, v in row.items()}
        assert {k: v for k, v in scalars.items() if k != "train/eta"} == {
            k: v for k, v in written.items() if k.startswith("train/")
        }
    etas = {step: scalars["train/eta"] for step, scalars in seen}
    assert all(v >= 0 for v in etas.values())
    assert etas[50] < etas[10]  # at 50 only the last validation is left


class Sleeps:
    """Iterations of about 10 ms and validation batches of about 15 ms; records every report's
    ETA with the clock."""

    def __init__(self) -> None:
        self.etas: list[tuple[float, float]] = []
        self.end = 0.0

    @hookimpl
    def after_train_iter(self) -> None:
        time.sleep(0.010)

    @hookimpl
    def after_val_iter(self) -> None:
        time.sleep(0.015)

    @hookimpl
    def after_report(self, scalars) -> None:
        self.etas.append((scalars["train/eta"], time.perf_counter()))

    @hookimpl
    def after_train(self) -> None:
        self.end = time.perf_counter()


@pytest.mark.timing
@pytest.mark.parametrize("by_epoch", [True, False], ids=["epochs", "iterations"])
def test_eta_predicts_the_remaining_time_validation_included(tmp_path, by_epoch):
    sleeps = Sleeps()
    schedule = (
        dict(max_epochs=3, train_dataloader=toy_data(80, 8, seed=0))
        if by_epoch
        else dict(
            max_epochs=None, max_iters=30, val_interval=10, train_dataloader=toy_data(96, 8, seed=0)
        )
    )
    runner = make_runner(
        tmp_path,
        hooks=[sleeps],
        log_interval=1,
        val_dataloader=toy_data(60, 10, seed=1),
        **schedule,
    )
    # a full garbage collection of the test process's heap (torch and everything imported,
    # some 0.2 s here) landing inside this 0.6 s run would be time no clock can foresee
    gc.collect()
    gc.disable()
    try:
        runner.train()
    finally:
        gc.enable()
    # mid-run, after the first validation pass: 15 iterations and 2 passes still to come
    eta, clock = sleeps.etas[14]
    true_remaining = sleeps.end - clock
    assert eta == pytest.approx(true_remaining, rel=0.25)
    assert sleeps.etas[-1][0] < 0.5 * true_remaining  # only the last pass left

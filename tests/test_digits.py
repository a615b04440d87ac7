"""The main job through the real CLI: a short digits run, read back from its logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _support import DIGITS, run
from hookrun.config import file as cfg
from hookrun.config.schedule import compute

EPOCHS = 3
ITERS_PER_EPOCH = 20  # 1,257 training digits in batches of 64


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("digits") / "run"
    result = run(
        "train",
        DIGITS,
        "--work-dir",
        work,
        "--set",
        f"runner.max_epochs={EPOCHS}",
    )
    assert result.returncode == 0, result.stderr
    return work, result.stdout


def jsonl(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]


def test_digits_prints_where_its_output_is(digits_run):
    work, stdout = digits_run
    assert "final metrics" in stdout
    assert f"tensorboard --logdir {work / 'tensorboard'}" in stdout
    assert f"JSONL log:    {work / 'log.jsonl'}" in stdout
    assert "best_accuracy.pt" in stdout


def test_digits_jsonl_and_tensorboard_agree(digits_run):
    work, _ = digits_run
    records = jsonl(work)
    assert records[0]["config"]["plugins"]["ema"] == {"decay": 0.99}
    val = [r for r in records if "val/accuracy" in r]
    assert [r["step"] for r in val] == [ITERS_PER_EPOCH * (e + 1) for e in range(EPOCHS)]
    test = [r for r in records if "test/accuracy" in r]
    assert len(test) == 1 and test[0]["test/accuracy"] > 0.9
    losses = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in losses] == list(range(10, EPOCHS * ITERS_PER_EPOCH + 1, 10))
    assert losses[-1]["train/loss"] < losses[0]["train/loss"]

    events = EventAccumulator(str(work / "tensorboard"))
    events.Reload()
    scalars = {
        tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]
    }
    assert {"train/loss", "train/lr", "val/accuracy", "test/accuracy"} <= set(scalars)
    for record in val + losses + test:
        for key, value in record.items():
            if "/" in key:
                assert scalars[key][record["step"]] == pytest.approx(value, rel=1e-6), key


def test_digits_checkpoints_evaluate_through_the_cli(digits_run):
    work, _ = digits_run
    best = work / "checkpoints" / "best_accuracy.pt"
    state = torch.load(best, weights_only=True)
    assert state["format"] == "hookrun/1" and "ema" in state["plugins"]
    saved = (work / "config.yaml").read_text()
    assert "max_epochs: 3" in saved and str(DIGITS.parent / "task.py") in saved

    result = run("test", DIGITS, "--checkpoint", best, "--work-dir", work)
    assert result.returncode == 0, result.stderr
    accuracy = [r["test/accuracy"] for r in jsonl(work) if "test/accuracy" in r]
    assert len(accuracy) == 2 and accuracy[-1] > 0.9
    assert f"accuracy {accuracy[-1]:.4g}" in result.stdout  # the test line, 4 significant digits


def test_digits_schedule_is_the_learning_rate_the_run_logged(digits_run):
    """`hookrun schedule`'s numbers, computed without training, at every logged iteration."""
    work, _ = digits_run
    overrides = [f"runner.max_epochs={EPOCHS}", "task_args.num_threads=null"]
    planned = {s.iter: s.lrs for s in compute(cfg.load(DIGITS, overrides))}
    assert len(planned) == EPOCHS * ITERS_PER_EPOCH
    logged = {r["step"]: r["train/lr"] for r in jsonl(work) if "train/lr" in r}
    assert sorted(logged) == list(range(10, EPOCHS * ITERS_PER_EPOCH + 1, 10))
    assert [logged[i] for i in sorted(logged)] == [planned[i][0] for i in sorted(logged)]
    assert all(len(set(planned[i])) == 1 for i in logged)  # the no_decay groups share the lr
    assert logged[10] < logged[20] > logged[30]  # warm-up over the first epoch, then cosine

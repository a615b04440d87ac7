"""early_stopping on scripted validation sequences stops where Ignite's and Lightning's
``EarlyStopping`` stop (run here where installed); thresholds, settings and errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from early_stopping_testing import scripted_runner
from torch import nn

from hookrun import ConfigError, PluginError, Runner


def hookrun_stop_epoch(tmp_path: Path, script: list[float], mode: str, patience: int,
                       min_delta: float) -> int:  # fmt: skip
    name = "accuracy" if mode == "max" else "val_loss"
    settings = {"patience": patience, "min_delta": min_delta}
    runner = scripted_runner(tmp_path, settings, script, name)
    runner.train()
    return runner.epoch


def ignite_stop_epoch(script: list[float], mode: str, patience: int, min_delta: float) -> int:
    """Ignite's EarlyStopping after an evaluator run each epoch. With ``cumulative=True`` its
    best moves only on an improvement by more than ``threshold`` (min_delta), as Lightning's
    and hookrun's do; its default also moves the best on smaller gains."""
    pytest.importorskip("ignite")
    from ignite.engine import Engine, Events
    from ignite.handlers import EarlyStopping

    trainer, evaluator = Engine(lambda e, b: None), Engine(lambda e, b: None)
    stopper = EarlyStopping(patience, lambda e: script[trainer.state.epoch - 1], trainer,
                            threshold=min_delta, cumulative=True, mode=mode)  # fmt: skip
    evaluator.add_event_handler(Events.COMPLETED, stopper)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    trainer.run([0], max_epochs=len(script))
    return trainer.state.epoch


def lightning_stop_epoch(script: list[float], mode: str, patience: int, min_delta: float) -> int:
    """Lightning's EarlyStopping decision (``_evaluate_stopping_criteria``) after each epoch."""
    callbacks = pytest.importorskip("lightning.pytorch.callbacks")
    stopper = callbacks.EarlyStopping(monitor="m", patience=patience, mode=mode,
                                      min_delta=min_delta)  # fmt: skip
    for epoch, value in enumerate(script, start=1):
        should_stop, _ = stopper._evaluate_stopping_criteria(torch.tensor(value))
        if should_stop:
            return epoch
    return len(script)


SEQUENCES = {
    "plateau": ("max", 2, 0.0, [0.5, 0.6, 0.6, 0.61, 0.59, 0.58, 0.7, 0.72]),
    "min_delta": ("max", 2, 0.02, [0.5, 0.6, 0.61, 0.63, 0.64, 0.65, 0.9, 0.95]),
    "loss": ("min", 3, 0.0, [1.0, 0.8, 0.85, 0.7, 0.75, 0.71, 0.72, 0.6, 0.5]),
    "late": ("min", 1, 0.05, [1.0, 0.9, 0.8, 0.7, 0.6, 0.58, 0.4]),
}


@pytest.mark.parametrize("case", SEQUENCES)
def test_stops_at_the_epoch_ignite_stops(case: str, tmp_path: Path) -> None:
    mode, patience, min_delta, script = SEQUENCES[case]
    stopped = hookrun_stop_epoch(tmp_path, script, mode, patience, min_delta)
    assert stopped < len(script)  # every sequence stops early
    assert stopped == ignite_stop_epoch(script, mode, patience, min_delta)


@pytest.mark.parametrize("case", SEQUENCES)
def test_stops_at_the_epoch_lightning_stops(case: str, tmp_path: Path) -> None:
    mode, patience, min_delta, script = SEQUENCES[case]
    expected = lightning_stop_epoch(script, mode, patience, min_delta)
    assert hookrun_stop_epoch(tmp_path, script, mode, patience, min_delta) == expected


def test_state_and_log_line_at_the_stop(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runner = scripted_runner(tmp_path, {"patience": 2}, [0.5, 0.7, 0.6, 0.7, 0.9])
    runner.train()
    assert runner.plugins["early_stopping"].state_dict() == {
        "best": pytest.approx(0.7), "wait": 2, "stopped_epoch": 4,
    }  # fmt: skip
    assert (runner.epoch, runner.iter) == (4, 8)
    out = capsys.readouterr()
    assert (
        "early_stopping: accuracy did not improve for 2 validations (best 0.7); training stops "
        "after epoch 4"
    ) in out.out + out.err


@pytest.mark.parametrize(
    ("settings", "script", "epoch"),
    [
        ({"stopping_threshold": 0.8}, [0.5, 0.8, 0.81, 0.9], 3),  # strictly better than 0.8
        ({"divergence_threshold": 0.3}, [0.5, 0.6, 0.3, 0.29, 0.9], 4),  # strictly worse
        ({}, [0.5, math.nan, 0.9], 2),
        ({"check_finite": False, "patience": 2}, [0.5, math.nan, -math.inf, 0.9], 3),
        ({"patience": 1, "min_epochs": 4}, [0.5, 0.4, 0.3, 0.2, 0.6, 0.7], 4),
        ({"patience": 1, "min_epochs": 4}, [0.5, 0.4, 0.3, 0.6, 0.5, 0.7], 5),
    ],
)
def test_thresholds_non_finite_values_and_min_epochs(
    tmp_path: Path, settings: dict, script: list[float], epoch: int
) -> None:
    runner = scripted_runner(tmp_path, settings, script)
    runner.train()
    assert runner.epoch == epoch


def test_iteration_based_runs_stop_at_the_validation_that_decides(tmp_path: Path) -> None:
    # validation every 3 iterations over 2-batch epochs: the third validation (iteration 9,
    # inside the fifth pass) is the first without improvement, patience 1
    runner = scripted_runner(tmp_path, {"patience": 1}, [0.5, 0.6, 0.6, 0.9], max_epochs=None,
                             max_iters=12, val_interval=3)  # fmt: skip
    runner.train()
    assert runner.iter == 9
    assert runner.plugins["early_stopping"].state_dict()["wait"] == 1


def test_rule_auto_reads_whole_words(tmp_path: Path) -> None:
    # "answer_accuracy" holds "wer": a substring rule would minimise it
    runner = scripted_runner(tmp_path, {"patience": 1}, [0.2, 0.9, 0.5, 0.95], "answer_accuracy")
    runner.train()
    assert runner.plugins["early_stopping"].best == pytest.approx(0.9)
    assert runner.epoch == 3


def test_runner_val_alone_counts_nothing(tmp_path: Path) -> None:
    runner = scripted_runner(tmp_path, {"patience": 1}, [0.5, 0.4, 0.3])
    runner.val()
    runner.val()
    assert runner.plugins["early_stopping"].state_dict() == {
        "best": None, "wait": 0, "stopped_epoch": None,
    }  # fmt: skip


def test_a_monitor_validation_does_not_report_names_what_it_reports(tmp_path: Path) -> None:
    runner = scripted_runner(tmp_path, {"monitor": "top1"}, [0.5, 0.6])
    with pytest.raises(ConfigError) as error:
        runner.train()
    assert error.value.lines == [
        "plugins.early_stopping.monitor: validation reports no metric 'top1' "
        "(it reports: accuracy, loss)"
    ]


def test_no_validation_is_an_error_before_training(tmp_path: Path) -> None:
    runner = scripted_runner(tmp_path, {}, [0.5], val_dataloader=None)
    with pytest.raises(ConfigError, match="plugins.early_stopping: needs a val_dataloader"):
        runner.train()
    assert runner.iter == 0


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"monitor": "distance"}, "plugins.early_stopping.rule: cannot tell from "
         "the metric name 'distance' whether greater or less is better; set rule: greater or "
         "rule: less (got 'auto')"),
        ({"patience": 0}, "plugins.early_stopping.patience: Input should be greater than or "
         "equal to 1 (got 0)"),
        ({"min_delta": -1}, "plugins.early_stopping.min_delta: Input should be greater than or "
         "equal to 0 (got -1)"),
        ({"rule": "up"}, "plugins.early_stopping.rule: Input should be 'greater', 'less' or "
         "'auto' (got 'up')"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_naming_the_field(settings: dict, line: str) -> None:
    with pytest.raises(PluginError) as error:
        Runner(nn.Linear(2, 2), criterion=nn.MSELoss(),
               plugins={"early_stopping": settings}, writers=())  # fmt: skip
    assert error.value.lines == [line]

"""early_stopping watching a training scalar (``monitor: train/loss``): checked every
``log_interval`` iterations on the mean over them, ``patience`` counted in checks, without a
validation loader, the same decision on every rank (docs/plugins/early_stopping.md)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from early_stopping_testing import scripted_loss_runner

from hookrun import ConfigError
from hookrun.testing import jsonl_series, run_ranks

TESTS = Path(__file__).parent


def rule_stop(script: list[float], interval: int, patience: int, min_delta: float = 0.0) -> int:
    """The documented rule, written out: every ``interval`` iterations the mean of the last
    ``interval`` losses; an improvement by more than ``min_delta`` resets the wait, anything
    else adds one; the run stops at the check whose wait reaches ``patience``."""
    best, wait = None, 0
    for done in range(interval, len(script) + 1, interval):
        value = sum(script[done - interval : done]) / interval
        if best is None or value < best - min_delta:
            best, wait = value, 0
            continue
        wait += 1
        if wait >= patience:
            return done
    return len(script)


SCRIPTS = {
    "plateau": ([3.0, 2.0, 2.5, 2.4, 2.6, 2.4, 2.1, 2.9, 2.5, 2.0, 1.0, 0.5], 2, 2, 0.0),
    "min_delta": ([4.0, 3.9, 3.8, 3.0, 2.95, 2.9, 2.9, 2.88, 2.86, 1.0, 1.0, 1.0], 3, 1, 0.1),
    "mid_epoch": ([5.0, 4.0, 4.5, 4.4, 4.6, 4.2, 4.8, 3.0, 2.0, 1.0], 1, 3, 0.0),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_training_stops_at_the_check_the_rule_names(tmp_path: Path, name: str) -> None:
    script, interval, patience, min_delta = SCRIPTS[name]
    expected = rule_stop(script, interval, patience, min_delta)
    assert expected < len(script)  # each script stops before its end
    settings = {"patience": patience, "min_delta": min_delta}
    runner = scripted_loss_runner(tmp_path, script, settings, log_interval=interval)
    runner.train()  # no val_dataloader: none is needed
    assert runner.iter == expected
    assert runner.plugins["early_stopping"].wait == patience


def test_each_check_takes_the_loss_the_report_of_its_iteration_writes(tmp_path: Path) -> None:
    script = SCRIPTS["plateau"][0]
    runner = scripted_loss_runner(tmp_path, script, {"patience": 2}, log_interval=2)
    runner.train()
    logged = dict(jsonl_series(tmp_path / "log.jsonl", "train/loss"))
    means = {done: sum(script[done - 2 : done]) / 2 for done in range(2, runner.iter + 1, 2)}
    assert logged == pytest.approx(means)


def test_a_training_scalar_that_is_not_recorded_is_one_line(tmp_path: Path) -> None:
    settings = {"monitor": "train/accuracy"}
    runner = scripted_loss_runner(tmp_path, [1.0] * 4, settings, log_interval=2)
    with pytest.raises(ConfigError) as refused:
        runner.train()
    assert refused.value.lines == [
        "plugins.early_stopping.monitor: training records no scalar 'train/accuracy' "
        "(it records: train/loss)"
    ]


def test_two_ranks_stop_together_on_rank_0s_loss(tmp_path: Path) -> None:
    job = TESTS / "jobs" / "train_monitor_job.py"
    scripts = runpy.run_path(str(job))  # rank 0's loss would stop the run, rank 1's would not
    run_ranks(job, tmp_path, path=[TESTS])
    expected = rule_stop(scripts["PLATEAU"], interval=2, patience=2)
    assert rule_stop(scripts["FALLING"], interval=2, patience=2) == len(scripts["FALLING"])
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == {"iter": expected}

"""``rule: auto`` decides through ``hookrun.metric_rule``; a name it cannot decide is a config
error naming the metric, whether ``save_best`` names it or ``auto`` picks it at run time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from checkpoint_testing import ScriptedModel

from hookrun import ConfigError, HookrunError


class NamedMetricModel(ScriptedModel):
    """Validation reports the scripted score under ``metric`` instead of ``accuracy``."""

    def __init__(self, metric: str, scores: list[float]) -> None:
        super().__init__(scores)
        self.metric = metric

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        return {self.metric: torch.tensor(self.scores[self.epoch - 1])}


def metric_runner(make_runner: Callable, checkpoint: dict[str, Any], metric: str) -> Any:
    model = NamedMetricModel(metric, [0.5, 0.9, 0.3])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    return make_runner(checkpoint, model=model, optimizer=optimizer)


def test_save_best_named_metric_without_a_rule_is_a_config_error(make_runner: Callable) -> None:
    with pytest.raises(HookrunError) as error:
        metric_runner(make_runner, {"save_best": "distance", "rule": "auto"}, "distance")
    assert str(error.value) == (
        "plugins.checkpoint.rule: cannot tell from the metric name 'distance' "
        "whether greater or less is better; set rule: greater or rule: less (got 'auto')"
    )


def test_save_best_auto_on_an_undecidable_first_metric_stops_before_saving(
    make_runner: Callable,
) -> None:
    runner = metric_runner(make_runner, {"save_best": "auto"}, "distance")
    with pytest.raises(ConfigError) as error:
        runner.train()
    assert error.value.lines == [
        "plugins.checkpoint.rule: cannot tell from the metric name 'distance' whether greater "
        "or less is better; set rule: greater or rule: less"
    ]
    assert not list(runner.checkpoint_dir.glob("best_*.pt"))


def test_an_explicit_rule_makes_any_name_usable(make_runner: Callable) -> None:
    runner = metric_runner(make_runner, {"save_best": "auto", "rule": "less"}, "distance")
    runner.train()
    assert runner.plugins["checkpoint"].best["distance"]["score"] == pytest.approx(0.3)
    assert (runner.checkpoint_dir / "best_distance.pt").is_file()


@pytest.mark.parametrize(
    ("metric", "best"),
    [("val_wer", 0.3), ("top1_error", 0.3), ("flowers_acc", 0.9), ("mIoU", 0.9)],
)
def test_auto_rule_is_hookruns_whole_word_rule(
    make_runner: Callable, metric: str, best: float
) -> None:
    runner = metric_runner(make_runner, {"save_best": "auto"}, metric)
    runner.train()
    assert runner.plugins["checkpoint"].best[metric]["score"] == pytest.approx(best)

"""The one metric-direction rule (``rule: auto``) and the shared duration format."""

from __future__ import annotations

import math

import pytest
import torch

import hookrun
from hookrun import better, format_duration, metric_rule, resolve_rule


@pytest.mark.parametrize(
    "name", ["answer_accuracy", "flowers_acc", "confidence_auc", "cancer_auc", "val/top1", "mAP"]
)
def test_score_like_names_are_maximised(name):
    assert metric_rule(name) == "greater"


@pytest.mark.parametrize(
    "name", ["val_wer", "fid", "mae", "top1_error", "val/loss", "test.nll", "char-err"]
)
def test_loss_like_names_are_minimised(name):
    assert metric_rule(name) == "less"


@pytest.mark.parametrize("name", ["distance", "terrain", "lossy", "accent", "", "val/"])
def test_names_without_a_whole_known_word_are_undecided(name):
    assert metric_rule(name) is None


def test_the_last_known_word_decides():
    assert metric_rule("top1_error") == "less"
    assert metric_rule("loss_acc") == "greater"
    assert metric_rule("error_rate_score") == "greater"


def test_resolve_rule_keeps_an_explicit_rule_and_refuses_to_guess():
    assert resolve_rule("distance", "less") == "less"
    assert resolve_rule("val_wer", "greater") == "greater"  # the user's word wins
    assert resolve_rule("answer_accuracy", "auto") == "greater"
    assert resolve_rule("val_wer", "auto") == "less"
    with pytest.raises(ValueError) as error:
        resolve_rule("distance", "auto")
    assert str(error.value) == (
        "cannot tell from the metric name 'distance' whether greater or less is better; "
        "set rule: greater or rule: less"
    )


def test_better_respects_rule_and_min_delta():
    assert better("greater", 0.9, 0.8) and not better("greater", 0.8, 0.8)
    assert better("less", 0.1, 0.2) and not better("less", 0.2, 0.1)
    assert not better("less", 0.15, 0.2, min_delta=0.1)
    assert better("greater", 0.95, 0.8, min_delta=0.1)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05"), (93784, "26:03:04"), (-5, "0:00:00")],
)
def test_format_duration_is_h_mm_ss(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_of_an_unknown_time():
    assert format_duration(math.inf) == format_duration(math.nan) == "-:--:--"


def test_shared_helpers_are_top_level_names():
    names = {"metric_rule", "resolve_rule", "better", "format_duration", "batch_size"}
    assert names <= set(hookrun.__all__)
    assert hookrun.batch_size((torch.zeros(4, 2), torch.zeros(4))) == 4

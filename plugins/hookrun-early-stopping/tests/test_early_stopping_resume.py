"""The plugin's state survives a SIGKILL and resume; with the checkpoint plugin, the state
training stopped in is saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from early_stopping_testing import scripted_runner

from hookrun.testing import check_kill_and_resume

# the resume task (3 epochs of 7 iterations): accuracy cannot improve by more than 1, so the
# first validation sets the best and the second stops training after epoch 2
STOP_AFTER_TWO = {"early_stopping": {"monitor": "accuracy", "patience": 1, "min_delta": 1.0}}


def test_sigkill_after_the_first_validation_then_resume_stops_at_the_same_epoch(
    tmp_path: Path,
) -> None:
    # killed in epoch 2 (after 11 iterations), resumed from iter_10.pt: a plugin that forgot
    # epoch 1's best would take epoch 2's accuracy as its first and train epoch 3 as well
    crashed = check_kill_and_resume(  # the reference trains in this process
        tmp_path, kill_at=11, exact_plugins=["early_stopping"], plugins=STOP_AFTER_TWO
    )
    final = torch.load(crashed / "final.pt", weights_only=True)
    assert (final["meta"]["epoch"], final["meta"]["iter"]) == (2, 14)
    state = final["plugins"]["early_stopping"]
    assert (state["wait"], state["stopped_epoch"]) == (1, 2)


def test_the_checkpoint_plugin_saves_the_state_training_stopped_in(tmp_path: Path) -> None:
    pytest.importorskip("hookrun_checkpoint")
    runner = scripted_runner(
        tmp_path,
        {},
        [0.5, 0.7, 0.6, 0.7, 0.9],
        plugins={
            "early_stopping": {"monitor": "accuracy", "patience": 2},
            "checkpoint": {"interval": 10},
        },
    )
    runner.train()
    out = runner.checkpoint_dir
    assert sorted(p.name for p in out.glob("*.pt")) == ["epoch_4.pt"]
    state = torch.load(out / "epoch_4.pt", weights_only=True)
    assert (state["meta"]["epoch"], state["meta"]["iter"]) == (4, 8)
    assert state["plugins"]["early_stopping"]["stopped_epoch"] == 4

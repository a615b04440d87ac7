"""``save_top_k`` keeps the k best checkpoints of a metric, as Ignite's ``Checkpoint(n_saved=k,
score_function=...)`` does for the same scores; and a run ended by ``stop_training`` leaves
its final state in a checkpoint.

ScriptedModel's validation reports ``accuracy = scores[completed epochs - 1]``; 4 iterations
per epoch."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_testing import EpochTeller
from torch import nn

from hookrun import PluginError, hookimpl

SCORES = (0.5, 0.9, 0.6, 0.9, 0.95, 0.7)  # the second 0.9 ties with the first: the first stays


def top_files(folder: Path) -> dict[int, float]:
    """Completed epochs -> score of each ``top_*.pt`` file, read from the file itself."""
    kept = {}
    for path in folder.glob("top_*.pt"):
        state = torch.load(path, weights_only=True)
        own = [
            e for e in state["plugins"]["checkpoint"]["top"]["accuracy"] if e["file"] == path.name
        ]
        kept[state["meta"]["epoch"]] = own[0]["score"]
    return kept


def ignite_top_k(scores: tuple[float, ...], k: int, folder: Path) -> list[int]:
    """The epochs whose checkpoints Ignite's ``Checkpoint(n_saved=k)`` keeps when validation
    after each epoch scores ``scores``."""
    handlers = pytest.importorskip("ignite.handlers")
    from ignite.engine import Engine, Events

    trainer, evaluator = Engine(lambda e, b: None), Engine(lambda e, b: None)
    keeper = handlers.Checkpoint(
        {"model": nn.Linear(1, 1)},
        handlers.DiskSaver(str(folder), create_dir=True, require_empty=False),
        n_saved=k,
        score_function=lambda engine: scores[trainer.state.epoch - 1],
        score_name="accuracy",
        global_step_transform=lambda engine, event: trainer.state.epoch,
    )
    evaluator.add_event_handler(Events.COMPLETED, keeper)
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda: evaluator.run([0]))
    trainer.run([0], max_epochs=len(scores))
    return sorted(int(re.match(r"model_(\d+)_", p.name)[1]) for p in folder.glob("*.pt"))


def test_top_2_keeps_exactly_the_two_best_files_ties_keeping_the_earlier(
    make_runner: Callable,
) -> None:
    runner = make_runner({"save_best": "accuracy", "save_top_k": 2, "interval": 10}, SCORES,
                         max_epochs=6)  # fmt: skip
    runner.train()
    out = runner.checkpoint_dir
    kept = top_files(out)
    assert kept == {2: pytest.approx(0.9), 5: pytest.approx(0.95)}
    assert {p.name for p in out.glob("top_*.pt")} == {
        "top_accuracy_0.9_iter_8.pt",
        "top_accuracy_0.95_iter_20.pt",
    }
    # the stable best file beside them, and the final state (save_last)
    assert torch.load(out / "best_accuracy.pt", weights_only=True)["meta"]["epoch"] == 5
    assert (out / "epoch_6.pt").is_file()


def test_top_2_keeps_the_epochs_ignite_keeps(make_runner: Callable, tmp_path: Path) -> None:
    scores = (0.3, 0.8, 0.8, 0.1, 0.85, 0.8, 0.9, 0.2)
    runner = make_runner({"save_best": "accuracy", "save_top_k": 2, "interval": 10}, scores,
                         max_epochs=len(scores))  # fmt: skip
    runner.train()
    assert sorted(top_files(runner.checkpoint_dir)) == ignite_top_k(scores, 2, tmp_path / "ig")


def test_top_k_with_less_is_better_keeps_the_smallest(make_runner: Callable) -> None:
    scores = (0.5, 0.2, 0.4, 0.1, 0.3)
    settings = {"save_best": "accuracy", "rule": "less", "save_top_k": 3, "interval": 10}
    runner = make_runner(settings, scores, max_epochs=5)
    runner.train()
    assert sorted(top_files(runner.checkpoint_dir)) == [2, 4, 5]


def test_top_k_bookkeeping_survives_resume(make_runner: Callable) -> None:
    settings = {"save_best": "accuracy", "save_top_k": 2}
    runner = make_runner(settings, SCORES, max_epochs=3)
    runner.train()
    out = runner.checkpoint_dir
    assert sorted(top_files(out)) == [2, 3]
    runner = make_runner(settings, SCORES, max_epochs=6)
    runner.train(resume="auto")
    # the newest file is epoch 3's top file, saved after its validation
    assert runner.resumed_from == out / "top_accuracy_0.6_iter_12.pt"
    # 0.9 (epoch 4) ties epoch 2's and stays out; 0.95 pushes epoch 3's 0.6 out of the top 2,
    # but the file the run resumed from is never deleted
    top = torch.load(out / "epoch_6.pt", weights_only=True)["plugins"]["checkpoint"]["top"]
    assert [e["epoch"] for e in top["accuracy"]] == [5, 2]
    assert sorted(top_files(out)) == [2, 3, 5]


def test_top_k_needs_save_best(make_runner: Callable) -> None:
    with pytest.raises(PluginError) as error:
        make_runner({"save_top_k": 2})
    assert error.value.lines == [
        "plugins.checkpoint.save_top_k: Value error, needs save_best: the metric whose best "
        "checkpoints are kept (got 2)"
    ]


class StopAfterEpoch:
    """Sets ``stop_training`` in ``after_train_epoch`` once ``done`` epochs are complete."""

    def __init__(self, done: int) -> None:
        self.done = done

    @hookimpl
    def after_train_epoch(self, runner: Any) -> None:
        runner.stop_training = runner.stop_training or runner.epoch + 1 == self.done


class StopAfterIter:
    """Sets ``stop_training`` in ``after_train_iter`` once ``done`` iterations are complete."""

    def __init__(self, done: int) -> None:
        self.done = done

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        runner.stop_training = runner.stop_training or runner.iter + 1 == self.done


class Validations:
    """Records the completed epochs each validation follows."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        self.epochs.append(runner.epoch)


def test_stop_at_an_epoch_end_validates_it_and_saves_the_final_state(
    make_runner: Callable,
) -> None:
    seen = Validations()
    runner = make_runner({"interval": 3}, max_epochs=5,
                         hooks=[EpochTeller(), StopAfterEpoch(2), seen])  # fmt: skip
    runner.train()
    assert seen.epochs == [1, 2]  # epoch 2's validation was due and ran
    out = runner.checkpoint_dir
    assert sorted(p.name for p in out.glob("*.pt")) == ["epoch_2.pt"]
    state = torch.load(out / "epoch_2.pt", weights_only=True)
    assert (state["meta"]["epoch"], state["meta"]["iter"]) == (2, 8)
    assert (out / "latest").read_text() == "epoch_2.pt\n"


def test_stop_mid_epoch_saves_the_final_iteration(make_runner: Callable) -> None:
    runner = make_runner({"interval": 3}, max_epochs=5,
                         hooks=[EpochTeller(), StopAfterIter(6)])  # fmt: skip
    runner.train()
    out = runner.checkpoint_dir
    assert sorted(p.name for p in out.glob("*.pt")) == ["iter_6.pt"]
    assert torch.load(out / "iter_6.pt", weights_only=True)["meta"]["iter"] == 6


def test_no_final_save_without_save_last(make_runner: Callable) -> None:
    runner = make_runner({"interval": 3, "save_last": False}, max_epochs=5,
                         hooks=[EpochTeller(), StopAfterEpoch(2)])  # fmt: skip
    runner.train()
    assert not list(runner.checkpoint_dir.glob("*.pt"))

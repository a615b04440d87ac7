"""One record for every kind of save: after a run that mixes periodic saves rotated by
``max_keep`` with ``save_best`` and ``save_top_k``, and after a resume that continues it, the
checkpoint folder holds exactly the files the plugin's record names (and ``latest``), the
record in memory is the one the newest file stores, and each best and top file's own record
agrees with it.

ScriptedModel's validation reports ``accuracy = scores[completed epochs - 1]``; 4 iterations
per epoch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hookrun_checkpoint
import pytest
import torch
from checkpoint_testing import EpochTeller
from hookrun_checkpoint.storage import LocalStorage

from hookrun import hookimpl

SETTINGS = {"by_epoch": False, "interval": 3, "max_keep": 2, "save_best": "accuracy",
            "save_top_k": 2}  # fmt: skip
SCORES = (0.5, 0.9, 0.6, 0.95, 0.7, 0.8, 0.97, 0.4)  # epoch 4's 0.95 is the resume point


def record_of(path: Path) -> dict[str, Any]:
    """The plugin's record that the checkpoint ``path`` stores."""
    return torch.load(path, weights_only=True)["plugins"]["checkpoint"]


def named(record: dict[str, Any]) -> set[str]:
    """Every file the record names, in any role."""
    files = set(record["kept"]) | {entry["file"] for entry in record["best"].values()}
    files |= {entry["file"] for entries in record["top"].values() for entry in entries}
    return files | {name for name in (record["latest"], record["resumed"]) if name is not None}


def assert_folder_is_the_record(runner: Any) -> dict[str, Any]:
    """The folder, the newest file's record and the plugin's record in memory agree; each best
    and top file records itself as the ledger does. Returns the record."""
    out = runner.checkpoint_dir
    newest = (out / "latest").read_text().strip()
    record = record_of(out / newest)
    assert record == runner.plugins["checkpoint"].state_dict()
    assert record["latest"] == newest
    assert {path.name for path in out.iterdir()} == named(record) | {"latest"}
    for metric, entry in record["best"].items():
        assert record_of(out / entry["file"])["best"][metric] == entry
    for metric, entries in record["top"].items():
        for entry in entries:
            own = record_of(out / entry["file"])["top"][metric]
            assert [e for e in own if e["file"] == entry["file"]] == [entry]
    return record


def periodic(iterations: int) -> list[str]:
    """The two newest periodic files of a run of ``iterations``: every 3rd, and the last."""
    saved = sorted({*range(3, iterations + 1, 3), iterations})
    return [f"iter_{n}.pt" for n in saved[-2:]]


def top_two(epochs: int) -> list[tuple[Any, int]]:
    """(score, epoch) of the two best validations of the first ``epochs``, ties to the earlier."""
    ranked = sorted((-score, epoch) for epoch, score in enumerate(SCORES[:epochs], 1))
    return [(pytest.approx(-score), epoch) for score, epoch in ranked[:2]]


@pytest.mark.parametrize("async_save", [False, True])
def test_folder_and_each_best_file_agree_with_the_record_across_a_resume(
    make_runner: Callable, async_save: bool
) -> None:
    settings = {**SETTINGS, "async_save": async_save}
    runner = make_runner(settings, SCORES, max_epochs=4)
    runner.train()
    record = assert_folder_is_the_record(runner)
    assert record["kept"] == periodic(16)
    tops = [(e["score"], e["epoch"]) for e in record["top"]["accuracy"]]
    assert tops == top_two(4)
    best = record["best"]["accuracy"]
    assert (best["score"], best["epoch"], best["file"]) == (
        pytest.approx(0.95),
        4,
        "best_accuracy.pt",
    )
    assert record["latest"] == "best_accuracy.pt"  # saved after epoch 4's periodic file

    # the resumed run starts from best_accuracy.pt: it keeps it as its resume point and
    # writes its own new best (0.97, epoch 7) beside it
    runner = make_runner(settings, SCORES, max_epochs=8)
    runner.train(resume="auto")
    assert runner.resumed_from == runner.checkpoint_dir / "best_accuracy.pt"
    record = assert_folder_is_the_record(runner)
    assert record["kept"] == periodic(32)
    tops = [(e["score"], e["epoch"]) for e in record["top"]["accuracy"]]
    assert tops == top_two(8)
    best = record["best"]["accuracy"]
    assert (best["score"], best["epoch"]) == (pytest.approx(0.97), 7)
    assert record["resumed"] == "best_accuracy.pt"
    assert record_of(runner.checkpoint_dir / "best_accuracy.pt")["best"]["accuracy"]["score"] == (
        pytest.approx(0.95)  # the resume point, as it was written
    )

    # one more resume, from the newest periodic file: the earlier resume point has no role
    # left (0.97 is the best), so it goes
    runner = make_runner(settings, (*SCORES, 0.99), max_epochs=9)
    runner.train(resume=runner.checkpoint_dir / "iter_32.pt")
    record = assert_folder_is_the_record(runner)
    assert not (runner.checkpoint_dir / "best_accuracy.iter_28.pt").exists()  # 0.99 replaced it
    assert record["best"]["accuracy"]["file"] == "best_accuracy.pt"
    assert record["best"]["accuracy"]["score"] == pytest.approx(0.99)


def test_every_file_the_plugin_writes_or_deletes_goes_through_its_storage(
    make_runner: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []

    class Recording(LocalStorage):
        def write(self, write: Any, state: Any, name: str) -> None:
            calls.append(("write", name))
            super().write(write, state, name)

        def write_text(self, name: str, text: str) -> None:
            calls.append(("write", name))
            super().write_text(name, text)

        def remove(self, name: str) -> None:
            calls.append(("remove", name))
            super().remove(name)

        def names(self) -> list[str]:
            calls.append(("list", ""))
            return super().names()

    monkeypatch.setattr(hookrun_checkpoint, "LocalStorage", Recording)
    runner = make_runner(SETTINGS, SCORES, max_epochs=4)
    runner.train()
    written = {name for op, name in calls if op == "write"}
    removed = {name for op, name in calls if op == "remove"}
    assert {path.name for path in runner.checkpoint_dir.iterdir()} == written - removed
    assert removed and removed <= written  # rotated and pushed-out files, all written here
    assert ("list", "") in calls  # leftovers of killed writes are looked for there too


class FailAt:
    """Raises after iteration ``n`` (counted from 1) of the first run."""

    def __init__(self, n: int) -> None:
        self.n = n

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.n:
            raise RuntimeError("boom")


def test_an_emergency_file_and_the_run_resumed_from_it_keep_folder_and_record_equal(
    make_runner: Callable,
) -> None:
    runner = make_runner(SETTINGS, SCORES, max_epochs=4, hooks=[EpochTeller(), FailAt(10)])
    with pytest.raises(RuntimeError, match="boom"):
        runner.train()
    record = assert_folder_is_the_record(runner)
    assert record["kept"] == ["iter_9.pt", "emergency_iter_10.pt"]

    runner = make_runner(SETTINGS, SCORES, max_epochs=4)
    runner.train(resume="auto")
    assert runner.resumed_from == runner.checkpoint_dir / "emergency_iter_10.pt"
    record = assert_folder_is_the_record(runner)
    assert record["kept"] == ["emergency_iter_10.pt", *periodic(16)]  # the resume point stays

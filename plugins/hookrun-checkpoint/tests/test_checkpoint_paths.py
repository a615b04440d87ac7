"""Nothing read from a checkpoint is used as a path: a checkpoint whose bookkeeping names
files outside the checkpoint folder deletes, reads and overwrites none of them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def plugin_state(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)["plugins"]["checkpoint"]


def test_bookkeeping_paths_from_a_checkpoint_are_ignored_and_nothing_outside_is_touched(
    make_runner: Callable, tmp_path: Path
) -> None:
    settings = {"by_epoch": False, "interval": 2, "max_keep": 1, "save_best": "accuracy"}
    runner = make_runner(settings, max_epochs=1)  # 4 iterations: iter_2.pt, iter_4.pt
    runner.train()
    out = runner.checkpoint_dir
    assert files(out) == {"iter_4.pt", "best_accuracy.pt", "latest"}

    # victims: an absolute path, one reached with "..", a best file and a latest outside
    victim = tmp_path / "abs" / "victim"
    victim.parent.mkdir()
    victim.write_text("precious")
    climber = out / ".." / ".." / "victim"  # tmp_path / "victim"
    climber.write_text("precious too")
    best_victim = tmp_path / "best_victim.pt"
    best_victim.write_text("not a checkpoint")
    (out / "iter_0.pt").symlink_to(victim)  # a plain name, but it leads out of the folder

    checkpoint = torch.load(out / "iter_4.pt", weights_only=True)
    checkpoint["plugins"]["checkpoint"] = {
        "kept": [str(victim), "../../victim", "iter_0.pt", "iter_4.pt", "", "..", 7],
        "best": {
            "accuracy": {
                "score": 0.1,
                "file": str(best_victim),
                "rule": "greater",
                "epoch": 1,
                "iter": 4,
            },
            "loss": {"score": "low", "file": "best_loss.pt", "rule": "less"},
        },
        "latest": str(tmp_path / "latest_victim"),
    }
    torch.save(checkpoint, out / "iter_4.pt")
    (out / "latest").write_text("iter_4.pt\n")

    # resumed from the doctored file (latest names it now), 12 more iterations, max_keep 1
    runner = make_runner(settings, max_epochs=4)
    runner.train(resume="auto")
    assert runner.resumed_from == out / "iter_4.pt"
    assert victim.read_text() == "precious"
    assert climber.read_text() == "precious too"
    assert best_victim.read_text() == "not a checkpoint"
    assert not (tmp_path / "latest_victim").exists()
    assert (out / "iter_0.pt").is_symlink()  # not the plugin's file: never deleted either
    assert files(out) == {"iter_0.pt", "iter_4.pt", "iter_16.pt", "best_accuracy.pt", "latest"}
    console = runner.console.file.getvalue()
    for line in (
        f"checkpoint: ignoring kept entry '{victim}' from the checkpoint: not a file name in {out}",
        f"checkpoint: ignoring kept entry '../../victim' from the checkpoint: "
        f"not a file name in {out}",
        f"checkpoint: ignoring kept entry '' from the checkpoint: not a file name in {out}",
        f"checkpoint: ignoring kept entry '..' from the checkpoint: not a file name in {out}",
        f"checkpoint: ignoring kept entry 7 from the checkpoint: not a file name in {out}",
        f"checkpoint: ignoring best entry 'accuracy' ('{best_victim}') from the checkpoint: "
        f"not a file name in {out}",
        "checkpoint: ignoring best entry 'loss' from the checkpoint: not a valid entry",
        f"checkpoint: ignoring latest '{tmp_path / 'latest_victim'}' from the checkpoint: "
        f"not a file name in {out}",
        "checkpoint: ignoring kept entry 'iter_0.pt' from the checkpoint: it resolves outside "
        f"{out}",
    ):
        assert console.count(line) == 1, line
    # the bookkeeping written since holds only the plugin's own names
    state = plugin_state(out / "iter_16.pt")
    assert state["kept"] == ["iter_4.pt", "iter_16.pt"]
    assert state["best"]["accuracy"]["file"] == "best_accuracy.pt"
    assert set(state["best"]) == {"accuracy"}

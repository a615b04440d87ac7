"""Host reads per iteration (what a GPU would wait for) and the state across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from nan_guard_testing import HostReads, Inject
from torch import nn

from hookrun import Runner
from hookrun.testing import SaveEvery, toy_data, toy_model


def reads_per_iteration(
    tmp_path: Path, monkeypatch: Any, guard: dict[str, Any] | None
) -> list[int]:
    """Host reads during each of iterations 2..15 of a 16-iteration epoch (log_interval 50:
    the core's one read per report falls outside)."""
    reads = HostReads(monkeypatch)
    model = toy_model()
    Runner(
        model,
        train_dataloader=toy_data(64, 4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        log_interval=50,
        work_dir=tmp_path / "run",
        plugins={"nan_guard": guard} if guard is not None else {},
        hooks=[reads],
        writers=(),
    ).train()
    starts = reads.at_iter_start
    return [starts[i + 1] - starts[i] for i in range(2, 15)]


@pytest.mark.parametrize(
    ("guard", "expected"),
    [
        (None, [0] * 13),  # the core alone: no read between reports
        ({}, [1] * 13),  # the skip decision: one read per optimizer step
        ({"check_every": 4}, [0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]),  # steps 4, 8, 12 read
    ],
    ids=["no guard", "check_every 1", "check_every 4"],
)
def test_host_reads_per_iteration(
    guard: Any, expected: list[int], tmp_path: Path, monkeypatch: Any
) -> None:
    assert reads_per_iteration(tmp_path, monkeypatch, guard) == expected


def run(tmp_path: Path, resume: Path | None = None) -> Runner:
    inject = Inject("grad", {1, 4})
    model = toy_model()
    runner = Runner(
        model,
        train_dataloader=toy_data(12, 4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        criterion=inject.criterion,
        max_epochs=2,
        work_dir=tmp_path / "run",
        plugins={"nan_guard": {}},
        hooks=[inject, SaveEvery(3, epochs=False)],
        writers=(),
    )
    runner.train(resume=resume)
    return runner


def test_counts_and_weights_continue_across_a_resume(tmp_path: Path) -> None:
    whole = run(tmp_path / "whole")
    resumed = run(tmp_path / "resumed", resume=tmp_path / "whole/run/checkpoints/iter_3.pt")
    saved = torch.load(tmp_path / "whole/run/checkpoints/iter_3.pt", weights_only=True)
    assert saved["loop"]["optimizer_steps"] == {"main": 3}  # check_every counts the core's
    assert saved["plugins"]["nan_guard"] == {
        "skipped": 1,
        "nonfinite": 1,
        "consecutive": 0,
    }
    assert resumed.plugins["nan_guard"].state_dict() == whole.plugins["nan_guard"].state_dict()
    assert whole.plugins["nan_guard"].state_dict()["skipped"] == 2
    for a, b in zip(
        whole.unwrapped_model.parameters(), resumed.unwrapped_model.parameters(), strict=True
    ):
        assert torch.equal(a, b) and bool(torch.isfinite(a).all())

"""NaN and inf injected at chosen iterations: skipped steps leave the weights equal to a
hand-written loop that leaves out the same steps; stop, raise and the late check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hookrun_nan_guard import NonFiniteError
from nan_guard_testing import Inject
from torch import nn

from hookrun import Runner
from hookrun.testing import toy_data, toy_model

EPOCHS, BATCHES = 2, 3  # toy_data(12, 4): 6 iterations


def guarded_run(tmp_path: Path, where: str, at: set[int], **guard: Any) -> Runner:
    inject = Inject(where, at)
    model = toy_model()
    runner = Runner(
        model,
        train_dataloader=toy_data(12, 4, shuffle=False),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        criterion=inject.criterion,
        max_epochs=EPOCHS,
        log_interval=2,
        work_dir=tmp_path / "run",
        plugins={"nan_guard": guard},
        hooks=[inject],
        writers=("jsonl",),
    )
    runner.train()
    return runner


def hand_loop(skip: set[int]) -> nn.Module:
    """The same training written out by hand, leaving out the optimizer steps in ``skip``."""
    model = toy_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = toy_data(12, 4, shuffle=False)
    it = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            if it not in skip:
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            it += 1
    return model


def reports(runner: Runner) -> list[dict[str, Any]]:
    lines = (runner.work_dir / "log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/skipped_steps" in r]


@pytest.mark.parametrize("where", ["input", "loss", "grad"])
def test_skipped_steps_match_a_hand_loop_without_them(where: str, tmp_path: Path) -> None:
    runner = guarded_run(tmp_path, where, {1, 4})
    reference = hand_loop(skip={1, 4})
    for (name, value), expected in zip(
        runner.unwrapped_model.state_dict().items(), reference.state_dict().values(), strict=True
    ):
        assert torch.isfinite(value).all(), name
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
    assert runner.iter == EPOCHS * BATCHES
    # reports at 2, 3 (epoch end), 4, 6: the counters as they were at each
    got = [
        (r["step"], r["train/skipped_steps"], r["train/nonfinite_grads"]) for r in reports(runner)
    ]
    assert got == [(2, 1, 1), (3, 1, 1), (4, 1, 1), (6, 2, 2)]


def test_without_the_guard_the_weights_are_lost(tmp_path: Path) -> None:
    """The injection is real: the same run unguarded ends with NaN weights."""
    inject = Inject("grad", {1})
    model = toy_model()
    Runner(
        model,
        train_dataloader=toy_data(12, 4, shuffle=False),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=inject.criterion,
        max_epochs=1,
        work_dir=tmp_path / "run",
        hooks=[inject],
        writers=(),
    ).train()
    assert not torch.isfinite(model.weight).all()


def test_three_bad_steps_in_a_row_stop_after_two_skips(tmp_path: Path) -> None:
    runner = guarded_run(tmp_path, "grad", {1, 2, 3}, max_consecutive=2)
    assert runner.iter == 4  # the third bad step (iteration 3) was skipped, then training ended
    reference = hand_loop(skip={1, 2, 3, 4, 5})
    for value, expected in zip(
        runner.unwrapped_model.state_dict().values(), reference.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
    assert runner.plugins["nan_guard"].state_dict()["skipped"] == 3


def test_escalate_raise_names_the_iteration_and_the_tensor(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteError) as info:
        guarded_run(tmp_path, "grad", {1, 2, 3}, max_consecutive=2, escalate="raise")
    assert str(info.value) == (
        "nan_guard: non-finite step at iteration 3 (3 in a row): not finite: grad of weight"
    )


def test_action_raise_names_the_loss(tmp_path: Path) -> None:
    with pytest.raises(
        NonFiniteError,
        match=r"iteration 2 \(1 in a row\): not finite: "
        r"grad of weight, grad of bias, loss\[0\]$",
    ):
        guarded_run(tmp_path, "loss", {2}, action="raise")


def test_a_late_check_fails_the_run_naming_the_window(tmp_path: Path) -> None:
    """check_every: 3 reads at steps 3 and 6: an inf at iteration 4 reaches the weights,
    iteration 5 is non-finite in turn, and the read there fails the run."""
    with pytest.raises(NonFiniteError) as info:
        guarded_run(tmp_path, "grad", {4}, check_every=3)
    assert str(info.value).startswith(
        "nan_guard: 2 non-finite step(s) between iterations 3 and 5, found late "
        "(check_every: 3); weights not finite: weight"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="amp: fp16 needs a CUDA device")
def test_fp16_reuses_gradscalers_check(tmp_path: Path) -> None:
    """An inf written into a (scaled) gradient: GradScaler finds it, the guard counts it."""
    inject = Inject("grad", {1})
    model = toy_model()
    runner = Runner(
        model,
        train_dataloader=toy_data(12, 4, shuffle=False),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=inject.criterion,
        max_epochs=1,
        device="cuda",
        amp="fp16",
        work_dir=tmp_path / "run",
        plugins={"nan_guard": {}},
        hooks=[inject],
        writers=(),
    )
    runner.train()
    state = runner.plugins["nan_guard"].state_dict()
    assert state["skipped"] == state["nonfinite"] >= 1
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())

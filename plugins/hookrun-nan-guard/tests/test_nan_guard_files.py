"""What the guard leaves on disk: no checkpoint with a non-finite tensor, the CLI's exit code
and message, settings errors."""

from __future__ import annotations

import importlib.util
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from nan_guard_testing import Inject

from hookrun import PluginError, Runner, hookimpl
from hookrun.testing import forked, isolated_env, tensors, toy_data, toy_model

needs_checkpoint = pytest.mark.skipif(
    importlib.util.find_spec("hookrun_checkpoint") is None,
    reason="the checkpoint plugin is not installed",
)


def floating_tensors(checkpoint: Any) -> list[tuple[str, torch.Tensor]]:
    return [(name, t) for name, t in tensors(checkpoint) if t.is_floating_point()]


def run_with_checkpoints(tmp_path: Path, guard: dict[str, Any], at: set[int]) -> Runner:
    inject = Inject("grad", at)
    model = toy_model()
    return Runner(
        model,
        train_dataloader=toy_data(12, 4, shuffle=False),
        optimizer=torch.optim.Adam(model.parameters(), lr=0.1),
        criterion=inject.criterion,
        max_epochs=2,
        work_dir=tmp_path / "run",
        plugins={
            "nan_guard": guard,
            "checkpoint": {"interval": 1, "by_epoch": False, "max_keep": None},
        },
        hooks=[inject],
        writers=(),
    )


@needs_checkpoint
@pytest.mark.parametrize("action", ["skip", "stop", "raise"])
def test_no_checkpoint_holds_a_non_finite_tensor(action: str, tmp_path: Path) -> None:
    """Adam (whose moments an inf would poison too), a save every iteration; with `stop`
    the last file holds the state training stopped with, with `raise` the emergency save
    is the last file."""
    runner = run_with_checkpoints(tmp_path, {"action": action}, {1, 4})
    if action == "raise":
        with pytest.raises(RuntimeError, match="iteration 1 "):
            runner.train()
    else:
        runner.train()
    files = sorted((tmp_path / "run" / "checkpoints").glob("*.pt"))
    names = {
        "skip": [f"iter_{i}.pt" for i in range(1, 7)],
        "stop": ["iter_1.pt", "iter_2.pt"],
        "raise": ["emergency_iter_2.pt", "iter_1.pt"],
    }
    assert [f.name for f in files] == sorted(names[action])
    for path in files:
        checkpoint = torch.load(path, weights_only=True)
        for name, tensor in floating_tensors(checkpoint):
            assert torch.isfinite(tensor).all(), f"{path.name}: {name}"
    last = torch.load(files[-1 if action != "raise" else 0], weights_only=True)["model"]
    for name, value in runner.unwrapped_model.state_dict().items():
        assert torch.equal(last[name], value), name


class PoisonWeights:
    """Writes a NaN into the weights after an iteration and then saves: what a guard that
    only looks at gradients cannot see (a NaN coming from elsewhere)."""

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == 2:
            with torch.no_grad():
                runner.unwrapped_model.bias[1] = math.inf
            runner.save_checkpoint(runner.work_dir / "poisoned.pt")


def test_a_checkpoint_with_a_non_finite_tensor_is_refused(tmp_path: Path) -> None:
    model = toy_model()
    runner = Runner(
        model,
        train_dataloader=toy_data(12, 4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=torch.nn.CrossEntropyLoss(),
        max_epochs=1,
        work_dir=tmp_path / "run",
        plugins={"nan_guard": {}},
        hooks=[PoisonWeights()],
        writers=(),
    )
    with pytest.raises(RuntimeError) as info:
        runner.train()
    assert str(info.value) == (
        "nan_guard: refusing to save a checkpoint at iteration 2: not finite: model/bias"
    )
    assert not (tmp_path / "run" / "poisoned.pt").exists()


TASK = """
import math
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class NanAt:
    def __init__(self, at):
        self.calls, self.at = 0, at
    def __call__(self, outputs, targets):
        loss = nn.functional.cross_entropy(outputs, targets)
        self.calls += 1
        return loss * math.nan if self.calls - 1 == self.at else loss

def build(nan_at=2):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    model = nn.Linear(4, 2)
    return {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=8),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": NanAt(nan_at),
    }
"""


def test_cli_raise_exits_1_naming_iteration_and_tensors(tmp_path: Path) -> None:
    (tmp_path / "nantask.py").write_text(textwrap.dedent(TASK))
    config = tmp_path / "nan.yaml"
    config.write_text(
        "task: nantask.py:build\n"
        "runner: {max_epochs: 1, device: cpu, writers: []}\n"
        "plugins: {nan_guard: {action: raise}}\n"
    )
    result = forked.run(
        [sys.executable, "-m", "hookrun", "train", str(config), "--work-dir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        env=isolated_env(),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert (
        "NonFiniteError: nan_guard: non-finite step at iteration 2 (1 in a row): not finite: "
        "grad of weight, grad of bias, loss[0]"
    ) in result.stderr


BAD = {
    "action": ("stopp", "plugins.nan_guard.action: Input should be 'skip', 'stop' or 'raise'"),
    "max_consecutive": (-1, "plugins.nan_guard.max_consecutive: Input should be greater than"),
    "escalate": ("skip", "plugins.nan_guard.escalate: Input should be 'stop' or 'raise'"),
    "check_every": (0, "plugins.nan_guard.check_every: Input should be greater than or equal"),
    "check_los": (True, "plugins.nan_guard.check_los: unknown setting (did you mean"),
}


@pytest.mark.parametrize("field", BAD)
def test_bad_setting_is_one_line_naming_the_field(field: str, tmp_path: Path) -> None:
    value, message = BAD[field]
    with pytest.raises(PluginError) as info:
        Runner(
            torch.nn.Linear(2, 2),
            criterion=torch.nn.MSELoss(),
            plugins={"nan_guard": {field: value}},
            work_dir=tmp_path,
            writers=(),
        )
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(message)


@needs_checkpoint
def test_stop_leaves_the_finite_state_in_the_checkpoint_plugins_final_save(tmp_path: Path) -> None:
    """Default checkpoint settings (by epoch): the run stopped at iteration 1 is saved by
    the checkpoint plugin's final save on stop_training, with the weights it stopped with."""
    inject = Inject("grad", {1})
    model = toy_model()
    runner = Runner(
        model,
        train_dataloader=toy_data(12, 4, shuffle=False),
        optimizer=torch.optim.Adam(model.parameters(), lr=0.1),
        criterion=inject.criterion,
        max_epochs=2,
        work_dir=tmp_path / "run",
        plugins={"nan_guard": {"action": "stop"}, "checkpoint": {}},
        hooks=[inject],
        writers=(),
    )
    runner.train()
    (path,) = (tmp_path / "run" / "checkpoints").glob("*.pt")
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["meta"]["iter"] == 2
    for name, tensor in floating_tensors(checkpoint):
        assert torch.isfinite(tensor).all(), name
    for name, value in model.state_dict().items():
        assert torch.equal(checkpoint["model"][name], value), name

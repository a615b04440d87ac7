"""EMA under gradient accumulation: one update per optimizer step, as Lightning's
WeightAveraging does, checked against ``torch.optim.swa_utils.AveragedModel`` driven by a
hand-written accumulation loop; and ``update_interval``'s step count across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Priority, Runner, hookimpl

EPOCHS, GRAD_ACCUM = 2, 2


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def batches() -> DataLoader:
    """5 batches of 4 samples, in a fixed order."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)


def hookrun_average(
    work_dir: Path,
    update_interval: int,
    grad_accum: int = GRAD_ACCUM,
    max_epochs: int = EPOCHS,
    hooks: tuple[object, ...] = (),
    resume: Path | None = None,
) -> dict[str, Any]:
    """The EMA plugin's state after training the MLP with SGD and momentum."""
    model = mlp()
    runner = Runner(
        model,
        train_dataloader=batches(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=max_epochs,
        grad_accum=grad_accum,
        work_dir=work_dir,
        writers=(),
        device="cpu",
        plugins={"ema": {"decay": 0.9, "warmup": False, "update_interval": update_interval}},
        hooks=hooks,
    )
    runner.train(resume=resume)
    return runner.plugins["ema"].state_dict()


def reference_average(update_interval: int) -> dict[str, torch.Tensor]:
    """Lightning's accumulation (a group closes every ``GRAD_ACCUM`` batches and at the
    epoch's end) with ``AveragedModel.update_parameters`` after every ``update_interval``-th
    optimizer step. AveragedModel copies the weights at its first update, so it is given the
    initial weights first, where hookrun's average starts."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    average.update_parameters(model)
    loader, steps = batches(), 0
    for _ in range(EPOCHS):
        for batch_idx, (x, y) in enumerate(loader):
            (nn.functional.cross_entropy(model(x), y) / GRAD_ACCUM).backward()
            if (batch_idx + 1) % GRAD_ACCUM == 0 or batch_idx + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                steps += 1
                if steps % update_interval == 0:
                    average.update_parameters(model)
    return average.module.state_dict()


@pytest.mark.parametrize("update_interval", [1, 2])
def test_one_update_per_optimizer_step(tmp_path: Path, update_interval: int) -> None:
    state = hookrun_average(tmp_path, update_interval)
    assert state["steps"] == 3 * EPOCHS  # batches 1, 3 and 4 of each epoch step
    assert state["updates"] == 3 * EPOCHS // update_interval
    want = reference_average(update_interval)
    assert state["model"].keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(state["model"][key], value), key


class SaveAtEpochEnd:
    """A checkpoint at the end of an epoch, after the average's last update (as the
    checkpoint plugin saves, at a low priority)."""

    priority = Priority.LOWEST

    def __init__(self, path: Path) -> None:
        self.path = path

    @hookimpl
    def after_train_epoch(self, runner: Any) -> None:
        runner.save_checkpoint(self.path)


def test_resume_between_two_updates_is_exact(tmp_path: Path) -> None:
    """Epoch 0 ends after 3 optimizer steps, between two updates of ``update_interval: 2``:
    the step count in the checkpoint keeps the resumed run on the same updates."""
    whole = hookrun_average(tmp_path / "whole", 2)
    path = tmp_path / "epoch_1.pt"
    hookrun_average(tmp_path / "first", 2, max_epochs=1, hooks=(SaveAtEpochEnd(path),))
    resumed = hookrun_average(tmp_path / "resumed", 2, resume=path)
    assert resumed["steps"] == whole["steps"]
    assert resumed["updates"] == whole["updates"]
    for key, value in whole["model"].items():
        assert torch.equal(resumed["model"][key], value), key

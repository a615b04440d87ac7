"""precise_bn leaves the training run unchanged: data order, augmentation, dropout, weights."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookrun import Runner


class Augmented(Dataset):
    """Random augmentation from the python, numpy and torch generators of the main process."""

    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 6, 6, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.rand(()) + float(np.random.rand()) + random.random()
        return self.x[i] + 0.1 * noise, self.y[i]


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),
    )  # fmt: skip


def run(tmp_path, plugins, **kwargs) -> tuple[nn.Module, Runner]:
    model = net()
    runner = Runner(
        model=model,
        train_dataloader=DataLoader(Augmented(), batch_size=10, shuffle=True),
        val_dataloader=DataLoader(Augmented(20), batch_size=10),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        work_dir=tmp_path / "run",
        writers=(),
        plugins=plugins,
        **kwargs,
    )
    runner.train()
    runner.rng_after = (torch.get_rng_state(), np.random.get_state()[1], random.getstate())
    return model, runner


RUNNING = ("running_mean", "running_var")


@pytest.mark.parametrize(
    ("settings", "length"),
    [
        ({"num_batches": 3}, {"max_epochs": 2}),
        ({"num_batches": 2, "by_epoch": False, "interval": 3}, {"max_iters": 7, "val_interval": 3}),
    ],
)
def test_training_is_bit_identical_with_the_plugin(tmp_path, settings, length) -> None:
    plain, plain_runner = run(tmp_path / "off", None, **length)
    precise, precise_runner = run(tmp_path / "on", {"precise_bn": settings}, **length)
    plain_state, precise_state = plain.state_dict(), precise.state_dict()
    for name, value in plain_state.items():
        if name.endswith(RUNNING):
            assert not torch.equal(value, precise_state[name]), name  # the plugin did its work
        else:
            assert torch.equal(value, precise_state[name]), name
    assert plain_runner.last_metrics != precise_runner.last_metrics  # validation saw new stats
    (torch_a, numpy_a, python_a), (torch_b, numpy_b, python_b) = (
        plain_runner.rng_after,
        precise_runner.rng_after,
    )
    assert torch.equal(torch_a, torch_b) and (numpy_a == numpy_b).all() and python_a == python_b


def test_schedule_by_epoch_and_by_iteration(tmp_path, monkeypatch) -> None:
    from hookrun_precise_bn import PreciseBN

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(PreciseBN, "recompute", lambda self, runner: calls.append(
        (runner.epoch, runner.iter)))  # fmt: skip
    run(tmp_path / "epochs", {"precise_bn": {"interval": 2}}, max_epochs=5)
    assert calls == [(1, 10), (3, 20), (4, 25)]  # every 2nd epoch and the last
    calls.clear()
    run(tmp_path / "iters", {"precise_bn": {"by_epoch": False, "interval": 3}}, max_iters=7)
    assert calls == [(0, 2), (1, 5), (1, 6)]  # every 3rd iteration and the last

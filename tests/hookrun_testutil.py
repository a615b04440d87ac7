"""Small models and data shared by the core tests (a unique name: plugin test folders have
their own conftest.py, and pytest collects them all in one session)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def toy_data(n: int = 12, batch_size: int = 4, shuffle: bool = True, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def toy_runner_kwargs(tmp_path: Path, **overrides):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    kwargs = dict(
        model=model,
        train_dataloader=toy_data(12, 4),
        val_dataloader=toy_data(8, 4, shuffle=False, seed=1),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        max_epochs=2,
        work_dir=tmp_path / "run",
        writers=(),
    )
    kwargs.update(overrides)
    return kwargs

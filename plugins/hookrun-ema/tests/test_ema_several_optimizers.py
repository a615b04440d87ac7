"""A run with several optimizers refuses the EMA with one line before training: it cannot
yet be told whose steps to follow (docs/plugins/ema.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hookrun import ConfigError, Runner
from hookrun.testing import toy_data


def test_several_optimizers_refuse_the_ema_before_training(tmp_path: Path) -> None:
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 2)
    model = nn.Sequential(body, head)
    runner = Runner(
        model=model,
        train_dataloader=toy_data(8, 4),
        optimizer={
            "body": torch.optim.SGD(body.parameters(), lr=0.1),
            "head": torch.optim.SGD(head.parameters(), lr=0.1),
        },
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        work_dir=tmp_path / "run",
        writers=(),
        plugins={"ema": {}},
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError) as info:
        runner.train()
    assert info.value.lines == [
        "plugins.ema: this run has several optimizers ('body', 'head') and the EMA cannot "
        "yet be told whose steps to follow; train without the ema plugin"
    ]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))

"""A run of the scripted model (validation reports ``accuracy = scores[epoch - 1]``, 4
iterations per epoch) keeping ``best_accuracy.pt``, for the failed-best tests.

Usage: PYTHONPATH=tests python tests/jobs/best_job.py WORK_DIR OPTIONS_JSON  (checkpoint_testing)
OPTIONS: scores, max_epochs, async_save, resume (bool: ``resume="auto"``), refuse_at (a user
hook raises in ``before_save_checkpoint`` for the best save of that epoch's validation).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from checkpoint_testing import EpochTeller, ScriptedModel
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl


class RefuseBest:
    """Raises in ``before_save_checkpoint`` when the checkpoint plugin saves the best of
    validation ``epoch`` (armed in ``after_val_epoch``, which runs before the plugin's)."""

    priority = 50

    def __init__(self, epoch: int | None) -> None:
        self.epoch, self.armed = epoch, False

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        self.armed = runner.epoch == self.epoch

    @hookimpl
    def before_save_checkpoint(self) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("user hook refuses the best checkpoint")


def main(work_dir: str, options: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, generator=g))
    model = ScriptedModel(list(options["scores"]))
    runner = Runner(
        model=model,
        train_dataloader=DataLoader(data, batch_size=4, shuffle=True),
        val_dataloader=DataLoader(data, batch_size=8),
        optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_epochs=options["max_epochs"],
        work_dir=Path(work_dir),
        plugins={
            "checkpoint": {"save_best": "accuracy", "async_save": options.get("async_save", False)}
        },
        hooks=[EpochTeller(), RefuseBest(options.get("refuse_at"))],
        writers=(),
    )
    runner.train(resume="auto" if options.get("resume") else None)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))

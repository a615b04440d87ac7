"""A training job for the kill and signal tests: random augmentation, dropout, AdamW, a
scheduler, the checkpoint plugin and a second stateful hook (``Counter``).

Usage: python checkpoint_job.py WORK_DIR OPTIONS_JSON
OPTIONS: resume (bool), kill_at (SIGKILL before that iteration), kill_in_save_at (SIGKILL
while collecting the checkpoint of that many iterations), sleep (seconds per iteration),
checkpoint (settings overrides). Prints "iter N" after each iteration; writes
WORK_DIR/final.pt when training ends.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookrun import Runner, hookimpl

CHECKPOINT = {"by_epoch": False, "interval": 3, "max_keep": 2, "save_best": "accuracy"}


class NoisyData(Dataset):
    """Fixed samples plus torch, numpy and python randomness in every fetch."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i] + 0.1 * torch.randn(8)
        x = x + float(np.random.normal(0, 0.05))
        if random.random() < 0.5:
            x = x.flip(0)
        return x, self.y[i]


class Counter:
    """A stateful ad-hoc hook: counts iterations and sums the losses (a tensor)."""

    name = "counter"

    def __init__(self, options: dict) -> None:
        self.options = options
        self.iters = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64)

    @hookimpl
    def before_train_iter(self, runner):
        if runner.iter == self.options.get("kill_at"):
            os.kill(os.getpid(), signal.SIGKILL)

    @hookimpl
    def after_train_iter(self, runner, outputs):
        self.iters += 1
        self.loss_sum += outputs["loss"].double()
        time.sleep(self.options.get("sleep", 0))
        print(f"iter {runner.iter + 1}", flush=True)

    @hookimpl
    def before_save_checkpoint(self, runner, checkpoint):
        if checkpoint["meta"]["iter"] == self.options.get("kill_in_save_at"):
            os.kill(os.getpid(), signal.SIGKILL)

    def state_dict(self) -> dict:
        return {"iters": self.iters, "loss_sum": self.loss_sum.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.iters = state["iters"]
        self.loss_sum = state["loss_sum"].clone()


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(1) == targets).float().mean()


def main(work_dir: str, options: dict) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    runner = Runner(
        model,
        DataLoader(NoisyData(40), batch_size=6, shuffle=True),
        DataLoader(NoisyData(12), batch_size=6),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        max_epochs=3,
        work_dir=work_dir,
        plugins={"checkpoint": {**CHECKPOINT, **options.get("checkpoint", {})}},
        hooks=[Counter(options)],
        writers=("jsonl",),
        seed=7,
    )
    runner.train(resume="auto" if options.get("resume") else None)
    runner.save_checkpoint(os.path.join(work_dir, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))

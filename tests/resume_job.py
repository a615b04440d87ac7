"""A training job for the crash tests: random augmentation, dropout, Adam, a scheduler.

Usage: python resume_job.py WORK_DIR NUM_WORKERS KILL_AT [--resume]
Saves iter_<n>.pt every 2 iterations and at each epoch end; SIGKILLs itself after
iteration KILL_AT (-1: never); writes WORK_DIR/final.pt at the end.
"""

from __future__ import annotations

import os
import random
import signal
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookrun import Runner, hookimpl


class NoisyDigits(Dataset):
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


class Saver:
    """Checkpoints every 2 iterations and at epoch ends; kills the process on demand."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(2):
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{runner.iter + 1}.pt")
        if runner.iter == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    @hookimpl
    def after_train_epoch(self, runner):
        runner.save_checkpoint(runner.checkpoint_dir / f"epoch_{runner.epoch + 1}.pt")


def main() -> None:
    work_dir, workers, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(NoisyDigits(40), batch_size=6, shuffle=True, num_workers=workers)
    runner = Runner(
        model,
        loader,
        DataLoader(NoisyDigits(12), batch_size=6),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=3,
        work_dir=work_dir,
        writers=("jsonl",),
        hooks=[Saver(kill_at)],
        seed=7,
    )
    runner.train(resume="auto" if "--resume" in sys.argv else None)
    runner.save_checkpoint(os.path.join(work_dir, "final.pt"))


if __name__ == "__main__":
    main()

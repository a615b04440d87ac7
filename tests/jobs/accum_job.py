"""Two ranks under torchrun, gradient accumulation in groups of 2: the run either saves a
checkpoint inside a group (after the group's first batch) and trains on, or resumes from such
a checkpoint. Rank 0 writes the final weights to ``WORK_DIR/final.pt``.

Usage: torchrun --nproc-per-node=2 accum_job.py WORK_DIR (--save-at N PATH | --resume PATH)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl


class SaveAt:
    def __init__(self, at: int, path: str) -> None:
        self.at, self.path = at, path

    @hookimpl
    def after_train_iter(self, runner):
        if runner.iter == self.at:
            runner.save_checkpoint(self.path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--save-at", nargs=2)
    parser.add_argument("--resume")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 6, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    hooks = [SaveAt(int(args.save_at[0]), args.save_at[1])] if args.save_at else []
    runner = Runner(
        model,
        train_dataloader=DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=2,
        grad_accum=2,
        work_dir=args.work_dir,
        writers=[],
        plugins={},
        hooks=hooks,
        device="cpu",
    )
    runner.train(resume=args.resume)
    if runner.is_main:
        torch.save(runner.unwrapped_model.state_dict(), args.work_dir / "final.pt")


if __name__ == "__main__":
    main()

"""The job of tests/test_each_sample_once.py: 25 samples in batches of 2 under DDP, gradients
accumulated over 3 batches; every rank notes the sample ids its steps see.

Usage: ``torchrun --nproc-per-node=N each_sample_once_job.py WORK_DIR [--resume-from CHECKPOINT]``;
writes ``rank<R>.pt`` (weights, optimizer) and ``steps_rank<R>.json`` into WORK_DIR.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl

SAMPLES, BATCH, EPOCHS, SAVE_AT = 25, 2, 3, 10  # SAVE_AT: 7 iterations of epoch 1, then 3
ACCUM = 3  # on 3 ranks the last group of an epoch is batches 4 and 5: the join holds batch 4's


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 3, generator=g)
    y = (x[:, 0] > 0).long()
    return TensorDataset(x, y, torch.arange(SAMPLES))  # the third item: the sample's id


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def optimizer(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


class Recorder:
    """Each iteration's sample ids on this rank (None: it joined without a batch)."""

    def __init__(self, save_at: int | None) -> None:
        self.steps: list[tuple[int, int, int, list[int] | None]] = []
        self.save_at = save_at

    @hookimpl
    def before_train_iter(self, runner: Any, batch_idx: int, batch: Any) -> None:
        ids = None if batch is None else batch[2].tolist()
        self.steps.append((runner.iter + 1, runner.epoch, batch_idx, ids))

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.save_at:
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{self.save_at}.pt")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--resume-from", type=Path)
    args = parser.parse_args(argv)
    net = model()
    recorder = Recorder(None if args.resume_from else SAVE_AT)
    runner = Runner(
        net,
        DataLoader(dataset(), batch_size=BATCH, shuffle=True),
        optimizer=optimizer(net),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=EPOCHS,
        grad_accum=ACCUM,
        work_dir=args.work_dir,
        writers=(),
        hooks=[recorder],
        seed=5,
        dist_timeout=60,
    )
    runner.train(resume=args.resume_from)
    torch.save(
        {"weights": net.state_dict(), "optimizer": runner.optimizer.state_dict()},
        args.work_dir / f"rank{runner.rank}.pt",
    )
    (args.work_dir / f"steps_rank{runner.rank}.json").write_text(json.dumps(recorder.steps))


if __name__ == "__main__":
    main()

"""A two-process job for the distributed tests; run it under torchrun.

Usage: torchrun --nproc-per-node=2 dist_job.py WORK_DIR [--kill-at N] [--resume] [--fail-at N]
       [--term-at N] [--with-plugins | --with-checkpoint] [--slow-rank1-data SECONDS]
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from hookrun import Runner, hookimpl


def data(n: int, seed: int, shuffle: bool, workers: int = 0, delay: float = 0.0) -> DataLoader:
    """``delay``: seconds each batch takes to load (a slow file system on one node)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    def collate(samples):
        time.sleep(delay)
        return default_collate(samples)

    return DataLoader(
        TensorDataset(x, y), batch_size=4, shuffle=shuffle, num_workers=workers, collate_fn=collate
    )


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2)
    )


PLUGINS = {"timer": {"warmup": 1, "window": 3}, "logger": {}}


class Job:
    """Checkpoints every 3 iterations; optionally dies, raises or (rank 1 alone) receives
    SIGTERM at an iteration; or (rank 0) SIGTERMs the whole process group: the torchrun agent,
    every rank and their loader workers, as a scheduler does."""

    def __init__(self, kill_at: int, fail_at: int, term_at: int, group_term_at: int) -> None:
        self.kill_at = kill_at
        self.fail_at = fail_at
        self.term_at = term_at
        self.group_term_at = group_term_at

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(3):
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{runner.iter + 1}.pt")
        if runner.iter == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if runner.iter == self.fail_at and runner.rank == 1:
            raise ValueError(f"injected failure on rank {runner.rank}")
        if runner.iter == self.term_at and runner.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        if runner.iter == self.group_term_at and runner.rank == 0:
            os.killpg(os.getpgid(0), signal.SIGTERM)

    @hookimpl
    def on_exception(self, runner, exception):
        (runner.work_dir / f"on_exception_rank{runner.rank}.txt").write_text(repr(exception))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--with-plugins", action="store_true")
    parser.add_argument("--with-checkpoint", action="store_true")
    parser.add_argument("--term-at", type=int, default=-1)
    parser.add_argument("--group-term-at", type=int, default=-1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--slow-rank1-data", type=float, default=0.0)
    args = parser.parse_args()
    net = model()
    delay = args.slow_rank1_data if os.environ.get("RANK") == "1" else 0.0
    runner = Runner(
        net,
        data(48, 1, shuffle=True, workers=args.workers, delay=delay),
        data(13, 2, shuffle=False),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        max_epochs=3,
        log_interval=6,
        work_dir=args.work_dir,
        writers=("tensorboard", "jsonl") if args.with_plugins else ("tensorboard",),
        plugins=PLUGINS
        if args.with_plugins
        else {"checkpoint": {}}
        if args.with_checkpoint
        else None,
        hooks=[Job(args.kill_at, args.fail_at, args.term_at, args.group_term_at)],
        seed=5,
    )
    runner.train(resume="auto" if args.resume else None)
    runner.save_checkpoint(args.work_dir / "final.pt")
    torch.save(
        {
            "weights": net.state_dict(),
            "metrics": runner.last_metrics["val"],
            "world_size": runner.world_size,
        },
        args.work_dir / f"rank{runner.rank}.pt",
    )


if __name__ == "__main__":
    main()

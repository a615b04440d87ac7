"""A multi-process job for the distributed tests; run it under torchrun or as SLURM tasks.

Usage: torchrun --nproc-per-node=2 dist_job.py WORK_DIR [--kill-at N] [--resume] [--fail-at N]
       [--term-at N] [--with-plugins | --with-checkpoint] [--subset] [--first-attempt-kill-at N]
       [--hang-at N] [--busy-at N] [--dist-timeout S] [--resume-from PATH]
       [--slow-rank1-data SECONDS]

Every rank writes ``seen_rank{R}.json``: the dataset indices it trained on, epoch by epoch in
order, and those of its last validation pass.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    SubsetRandomSampler,
    TensorDataset,
    default_collate,
)

from hookrun import Runner, hookimpl


class Recorded(Dataset):
    """A dataset that notes every index fetched in this process (``num_workers=0``)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        self.fetched.append(int(index))
        return self.dataset[index]


def data(
    n: int, seed: int, shuffle: bool, workers: int = 0, sampler: Any = None, delay: float = 0.0
) -> DataLoader:
    """``delay``: seconds each batch takes to load (a slow file system on one node)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    def collate(samples):
        time.sleep(delay)
        return default_collate(samples)

    return DataLoader(
        Recorded(TensorDataset(x, y)),
        batch_size=4,
        shuffle=shuffle,
        num_workers=workers,
        sampler=sampler,
        collate_fn=collate,
    )


SPLIT = torch.randperm(64, generator=torch.Generator().manual_seed(3)).tolist()
TRAIN_SPLIT, VAL_SPLIT = sorted(SPLIT[:40]), sorted(SPLIT[40:])
"""A train/validation split of one 64-sample dataset by ``SubsetRandomSampler`` (``--subset``)."""


def split_data() -> tuple[DataLoader, DataLoader]:
    return (
        data(64, 1, False, sampler=SubsetRandomSampler(TRAIN_SPLIT)),
        data(64, 1, False, sampler=SubsetRandomSampler(VAL_SPLIT)),
    )


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2)
    )


PLUGINS = {"timer": {"warmup": 1, "window": 3}, "logger": {}}


class Job:
    """Checkpoints every 3 iterations; optionally dies, raises, hangs or (rank 1 alone)
    receives SIGTERM at an iteration; rank 1 dies in torchrun's first attempt only, or dies
    while rank 0 is busy in host code (``--busy-at``, its time in ``rank1_killed``); or (rank 0)
    SIGTERMs the whole process group: the torchrun agent, every rank and their loader workers,
    as a scheduler does."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.kill_at = args.kill_at
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        self.rank1_kill_at = args.first_attempt_kill_at if first else -1
        self.fail_at = args.fail_at
        self.term_at = args.term_at
        self.group_term_at = args.group_term_at
        self.hang_at = args.hang_at
        self.busy_at = args.busy_at
        self.seen: dict[str, Any] = {"train": {}, "val": []}

    @hookimpl
    def before_val_epoch(self, runner):
        runner.val_dataloader.dataset.fetched.clear()

    @hookimpl
    def after_val_epoch(self, runner, metrics):
        self.seen["val"] = list(runner.val_dataloader.dataset.fetched)

    @hookimpl
    def after_train_iter(self, runner):
        fetched = runner.train_dataloader.dataset.fetched
        self.seen["train"].setdefault(str(runner.epoch), []).extend(fetched)
        fetched.clear()
        if runner.is_last_iter():  # what the checkpoint plugin's final save waits for
            self.seen.setdefault("last_iter", []).append(runner.iter)
        if runner.iter == self.hang_at and runner.rank == 1:
            time.sleep(3600)  # a rank that hangs: the others wait in DDP's all-reduce
        if runner.iter == self.busy_at and runner.rank == 1:
            (runner.work_dir / "rank1_killed").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if runner.iter == self.busy_at and runner.rank == 0:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # busy in host code, no collective
                pass
        if runner.every_n_iters(3):
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{runner.iter + 1}.pt")
        if runner.iter == self.kill_at or (runner.iter == self.rank1_kill_at and runner.rank == 1):
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--first-attempt-kill-at", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--busy-at", type=int, default=-1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--resume-from", type=Path)
    parser.add_argument("--with-plugins", action="store_true")
    parser.add_argument("--with-checkpoint", action="store_true")
    parser.add_argument("--subset", action="store_true")
    parser.add_argument("--term-at", type=int, default=-1)
    parser.add_argument("--group-term-at", type=int, default=-1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--dist-timeout", type=float, default=600.0)
    parser.add_argument("--slow-rank1-data", type=float, default=0.0)
    args = parser.parse_args(argv)
    delay = args.slow_rank1_data if os.environ.get("RANK") == "1" else 0.0
    net = model()
    train, val = (
        split_data()
        if args.subset
        else (
            data(48, 1, shuffle=True, workers=args.workers, delay=delay),
            data(13, 2, shuffle=False),
        )
    )
    job = Job(args)
    runner = Runner(
        net,
        train,
        val,
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
        hooks=[job],
        seed=5,
        dist_timeout=args.dist_timeout,
    )
    runner.train(resume=args.resume_from or ("auto" if args.resume else None))
    runner.save_checkpoint(args.work_dir / "final.pt")
    torch.save(
        {
            "weights": net.state_dict(),
            "metrics": runner.last_metrics["val"],
            "world_size": runner.world_size,
        },
        args.work_dir / f"rank{runner.rank}.pt",
    )
    (args.work_dir / f"seen_rank{runner.rank}.json").write_text(json.dumps(job.seen))


if __name__ == "__main__":
    main()

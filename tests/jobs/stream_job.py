"""A training job over a stream or a stateful loader, for tests/test_streams.py; run it as
one process or under torchrun.

Usage: python stream_job.py WORK_DIR --kind map|iterable|plain [--kill-at N] [--resume]

``map``: torchdata's ``StatefulDataLoader`` over a map-style dataset, shuffled (under
torch.distributed through a ``DistributedSampler``); ``iterable``: a ``StatefulDataLoader``
over :class:`ShuffledStream`, an ``IterableDataset`` with its own ``state_dict`` that yields
this rank's share; ``plain``: a ``DataLoader`` over :class:`ShuffledStream` without its state
(a stream hookrun cannot resume mid-epoch). 3 epochs, a checkpoint every 2 iterations and at
each epoch's end, SIGKILLed as iteration ``--kill-at`` is about to start; ``final.pt`` at
the end.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from hookrun import Runner, already_sharded
from hookrun.testing import KillAt, SaveEvery

SAMPLES, BATCH, EPOCHS = 26, 3, 3


def samples() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(SAMPLES, 5, generator=g)
    return x, (x[:, 0] - x[:, 2] > 0).long()


class ShuffledStream(IterableDataset):
    """This rank's share of the samples in an order drawn anew each epoch (from its own
    epoch counter), without ``__len__``; ``state_dict`` holds the epoch and the samples
    yielded in it, so a ``StatefulDataLoader`` resumes it mid-epoch."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.x, self.y = samples()
        self.rank, self.world = rank, world
        self.epoch, self.pos, self.restored = -1, 0, False

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos, self.restored = state["epoch"], state["pos"], True

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # the epoch is settled when the iterator is made, not at its first item: a loader
        # restored at an epoch's end makes one it never reads, then the next epoch's
        if not self.restored:
            self.epoch, self.pos = self.epoch + 1, 0
        self.restored = False
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(100 + self.epoch))
        return self._samples(order[self.rank :: self.world].tolist())

    def _samples(self, mine: list[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while self.pos < len(mine):
            i = mine[self.pos]
            self.pos += 1
            yield self.x[i], self.y[i]


def loader(kind: str, rank: int, world: int) -> Any:
    if kind == "map":
        data = TensorDataset(*samples())
        if world == 1:
            return StatefulDataLoader(data, batch_size=BATCH, shuffle=True)
        sampler = DistributedSampler(data, world, rank, shuffle=True, seed=5)
        return StatefulDataLoader(data, batch_size=BATCH, sampler=sampler)
    if kind == "iterable":
        return already_sharded(StatefulDataLoader(ShuffledStream(rank, world), batch_size=BATCH))
    return already_sharded(DataLoader(ShuffledStream(rank, world), batch_size=BATCH))


def main(argv: list[str] | None = None) -> Runner:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--kind", choices=["map", "iterable", "plain"], required=True)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))
    runner = Runner(
        model,
        train_dataloader=loader(args.kind, rank, world),
        optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=EPOCHS,
        work_dir=args.work_dir,
        writers=("jsonl",),
        plugins={},
        hooks=[SaveEvery(2), KillAt(args.kill_at)],
        log_interval=1,
        seed=3,
    )
    runner.train(resume="auto" if args.resume else None)
    runner.save_checkpoint(args.work_dir / "final.pt")
    return runner


if __name__ == "__main__":
    main()

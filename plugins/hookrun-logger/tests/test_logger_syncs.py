"""Host reads of tensors during training, counted by wrapping the torch.Tensor methods that
move a value to the host: none between the core's reports, one batched read per report, and
nothing more with the logger rendering them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hookrun import hookimpl

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


class IterationClock:
    """Runs first in every iteration and remembers which one is running (None outside)."""

    priority = 0

    def __init__(self) -> None:
        self.current: int | None = None

    @hookimpl
    def before_train_iter(self, runner) -> None:
        self.current = runner.iter

    @hookimpl
    def after_train_epoch(self) -> None:
        self.current = None


def sequential_loader() -> DataLoader:
    """In order: a shuffling sampler draws its permutation with ``randperm().tolist()`` (a
    host-side read of a CPU tensor, not the logger's) when an epoch's iterator runs out."""
    data = TensorDataset(torch.randn(200, 4), torch.randint(0, 2, (200,)))
    return DataLoader(data, batch_size=8, shuffle=False)


@pytest.fixture
def count_reads(monkeypatch):
    """Wrap every host-read method; returns (clock, Counter of (iteration, method))."""
    clock = IterationClock()
    reads: Counter[tuple[int, str]] = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *args, _original=original, _name=name, **kwargs):
            if clock.current is not None:
                reads[(clock.current, _name)] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return clock, reads


@pytest.mark.parametrize("progress", ["lines", "bar"])
def test_one_batched_read_per_interval_and_none_in_between(make_runner, count_reads, progress):
    clock, reads = count_reads
    runner = make_runner(
        {"interval": 10, "progress": progress},
        hooks=[clock],
        val_dataloader=None,
        train_dataloader=sequential_loader(),
    )
    runner.scalars.batched = True  # as on a GPU (on the CPU values are read one by one)
    runner.train()  # 50 iterations: reports at 10, 20, 25 (epoch end), 30, 40, 50
    assert reads == Counter(
        {
            (9, "tolist"): 1,
            (19, "tolist"): 1,
            (24, "tolist"): 1,
            (29, "tolist"): 1,
            (39, "tolist"): 1,
            (49, "tolist"): 1,
        }
    )


def test_the_count_sees_a_read_when_there_is_one(make_runner, count_reads):
    """The counter itself works: a hook reading the loss every iteration is caught."""
    clock, reads = count_reads

    class Reader:
        @hookimpl
        def after_train_iter(self, outputs) -> None:
            outputs["loss"].item()

    runner = make_runner(
        {"progress": "off"},
        hooks=[clock, Reader()],
        val_dataloader=None,
        max_epochs=1,
        train_dataloader=sequential_loader(),
        log_interval=25,
    )
    runner.scalars.batched = True  # the report's read is one tolist, as on a GPU
    runner.train()
    assert sum(n for (_, name), n in reads.items() if name == "item") == 25
    assert reads[(24, "tolist")] == 1

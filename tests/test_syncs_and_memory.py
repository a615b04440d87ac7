"""No host-device syncs in steady-state iterations; memory flat over a long run."""

from __future__ import annotations

import json
import statistics
import sys
from array import array
from collections.abc import Sequence

import torch
from torch import nn

from hookrun import Runner, hookimpl
from hookrun.testing import toy_data

SYNC_METHODS = ["item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"]


class SyncCounter:
    """Counts calls of Tensor methods that read a value to the host."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        for name in SYNC_METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(original))

    def _wrap(self, original):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)

        return counted


class Snapshots:
    def __init__(self, counter: SyncCounter) -> None:
        self.counter = counter
        self.at_iter_start: list[int] = []

    @hookimpl
    def before_train_iter(self):
        self.at_iter_start.append(self.counter.count)


def test_steady_state_iterations_read_nothing_to_host(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    counter = SyncCounter(monkeypatch)
    snaps = Snapshots(counter)
    runner = Runner(
        model,
        toy_data(64, 4),
        optimizer=optimizer,
        criterion=nn.CrossEntropyLoss(),
        max_epochs=2,
        clip_grad=1.0,
        hooks=[snaps],
        writers=(),
        work_dir=tmp_path,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1),
        scheduler_interval="iter",
        log_interval=50,  # the one read per interval falls outside the window below
    )
    runner.train()
    steady = snaps.at_iter_start[2:16]  # iterations 2..15 of epoch 0
    assert steady[-1] - steady[0] == 0
    before = counter.count  # the counter does see a read when one happens
    runner.scalars.latest(["train/loss"])
    assert counter.count == before + 1


def test_scalars_read_is_one_batched_transfer(monkeypatch):
    from hookrun.engine.scalars import ScalarStore

    store = ScalarStore(window=5)
    for i in range(12):
        store.put("a", torch.tensor(float(i)))
        store.put("b", torch.tensor(2.0 * i))
    store.put("c", 3.5)
    counter = SyncCounter(monkeypatch)
    means = store.mean()
    assert counter.count == 1
    assert means == {"a": 9.0, "b": 18.0, "c": 3.5}
    assert len(store.history("a")) == 5


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Theil-Sen slope of ``ys`` against ``xs``: the median of every pairwise slope, so a
    transient spike or dip of the allocator does not tilt it the way least squares would."""
    pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for j in range(len(xs)) for i in range(j)]
    return statistics.median(pairs)


class MemoryProbe:
    """Every ``every`` iterations records the iteration, RSS and Python's allocated heap
    blocks into preallocated arrays (recording allocates no Python object, so the probe
    itself does not show as growth)."""

    def __init__(self, iters: int, every: int) -> None:
        self.every = every
        self.at, self.rss, self.blocks = (array("q", [0] * (iters // every)) for _ in range(3))
        self.n = 0

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(self.every):
            self.at[self.n], self.rss[self.n] = runner.iter + 1, rss_bytes()
            self.blocks[self.n] = sys.getallocatedblocks()
            self.n += 1


def test_memory_stays_flat_over_a_long_run(tmp_path):
    """Memory against iteration count after warm-up fits a slope of ~0, extrapolated to 100k
    iterations (what the former single 100k-iteration run measured, in an eighth of the
    time): RSS under 8 MiB (~84 bytes per iteration: a graph kept alive by an undetached loss
    fails) and Python's heap under 5000 blocks (every leaked object, a tensor's included, is
    a block: one per 20 iterations fails; torch's own record_function objects and garbage
    awaiting the collector make up a few hundred)."""
    iters, warmup = 12_000, 2_000
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    probe = MemoryProbe(iters, every=500)
    runner = Runner(
        model,
        toy_data(4000, 4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        criterion=nn.CrossEntropyLoss(),
        max_iters=iters,
        hooks=[probe],
        writers=("jsonl", "tensorboard"),
        log_interval=100,  # the core reads the store and writes both writers every 100
        work_dir=tmp_path,
    )
    runner.train()
    steady = [i for i in range(probe.n) if probe.at[i] >= warmup]
    at = [probe.at[i] for i in steady]
    blocks = slope(at, [probe.blocks[i] for i in steady]) * 100_000
    assert blocks < 5000, f"Python's heap grows by {blocks:.0f} blocks per 100k iterations"
    rss = slope(at, [probe.rss[i] for i in steady]) * 100_000
    assert rss < 8 * 2**20, f"RSS grows by {rss / 2**20:.1f} MiB per 100k iterations"
    assert len(runner.scalars.history("train/loss")) == runner.scalars.window
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    steps = sorted({line["step"] for line in lines if "train/loss" in line})
    assert steps == list(range(100, iters + 1, 100))  # every report reached the log

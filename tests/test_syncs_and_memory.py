"""No host-device syncs in steady-state iterations; memory flat over a long run."""

from __future__ import annotations

import torch
from torch import nn

from hookrun import Runner, hookimpl
from hookrun_testutil import toy_data

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
    )
    runner.train()
    steady = snaps.at_iter_start[2:16]  # iterations 2..15 of epoch 0
    assert steady[-1] - steady[0] == 0
    before = counter.count  # the counter does see a read when one happens
    runner.scalars.latest(["train/loss"])
    assert counter.count == before + 1


def test_scalars_read_is_one_batched_transfer(monkeypatch):
    from hookrun.scalars import ScalarStore

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


class MemoryProbe:
    """Logs every 100 iterations like a logger would and samples RSS."""

    def __init__(self) -> None:
        self.rss: dict[int, int] = {}

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(100):
            runner.write_scalars(runner.scalars.mean(["train/loss"]))
        if runner.iter + 1 in (10_000, 100_000):
            self.rss[runner.iter + 1] = rss_bytes()


def test_memory_stays_flat_over_100k_iterations(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    probe = MemoryProbe()
    runner = Runner(
        model,
        toy_data(4000, 4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        criterion=nn.CrossEntropyLoss(),
        max_iters=100_000,
        hooks=[probe],
        writers=("jsonl", "tensorboard"),
        work_dir=tmp_path,
    )
    runner.train()
    growth = probe.rss[100_000] - probe.rss[10_000]
    assert growth < 8 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB from 10k to 100k iterations"
    assert len(runner.scalars.history("train/loss")) == runner.scalars.window
    assert (tmp_path / "log.jsonl").read_text().count("\n") == 1000

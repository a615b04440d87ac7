"""On a real CUDA device: no host-device synchronisation between logging intervals (with
``torch.cuda.set_sync_debug_mode("error")``), AMP, CUDA-event timing and async checkpoints.

Skipped without a GPU (CI has none); run on a GPU machine with ``pytest tests/test_cuda.py``.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

INTERVAL = 10
ALL_PLUGINS = {
    "logger": {"interval": INTERVAL},
    "timer": {"warmup": 2},
    "checkpoint": {"interval": 1},
    "ema": {"decay": 0.99},
    "precise_bn": {"num_batches": 4},
}


def loader(n: int = 640, batch_size: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, pin_memory=True)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))


class SyncGuard:
    """Makes every host-device synchronisation an error from the start of an iteration to the
    end of the next, except where the logger reads its interval and at epoch ends.

    Priority 0 runs first at every hook point: at a logging iteration the guard is lifted
    before the logger's ``after_train_iter`` reads the scalars.
    """

    priority = 0

    def __init__(self, warmup: int = 3) -> None:
        self.warmup = warmup
        self.guarded = 0

    @hookimpl
    def before_train_iter(self, runner) -> None:
        if runner.iter >= self.warmup:
            torch.cuda.set_sync_debug_mode("error")
            self.guarded += 1

    @hookimpl
    def after_train_iter(self, runner) -> None:
        if runner.every_n_iters(INTERVAL):
            torch.cuda.set_sync_debug_mode(0)

    @hookimpl
    def after_train_epoch(self) -> None:
        torch.cuda.set_sync_debug_mode(0)

    @hookimpl
    def on_exception(self) -> None:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("amp", [None, "bf16", "fp16"])
def test_no_synchronisation_between_logging_intervals(tmp_path, amp):
    net = model()
    # fp16's GradScaler reads found_inf to the host in step() unless the optimizer is fused
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, fused=amp == "fp16")
    guard = SyncGuard()
    runner = Runner(
        net,
        loader(),
        loader(128, seed=1),
        optimizer=optimizer,
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        max_epochs=2,
        work_dir=tmp_path,
        plugins=ALL_PLUGINS,
        hooks=[guard],
        amp=amp,
        clip_grad=1.0,
        device="cuda",
    )
    try:
        runner.train()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert guard.guarded == 2 * 20 - 3
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train] == list(range(INTERVAL, 41, INTERVAL))
    assert all(r["train/memory"] > 0 and r["train/time"] > 0 for r in train)
    assert train[-1]["train/loss"] < train[0]["train/loss"]
    assert set(runner.last_metrics["val"]) == {"loss", "accuracy"}
    if amp == "fp16":
        saved = torch.load(tmp_path / "checkpoints" / "epoch_2.pt", weights_only=True)
        assert saved["scaler"]["scale"] == runner.scaler.get_scale()


class Matmuls(nn.Module):
    """GPU work that dwarfs the host's: the iteration time is the device's."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2048, 2048) / 45)

    def training_step(self, batch):
        x = batch[0]
        for _ in range(20):
            x = torch.tanh(x @ self.weight)
        return x.square().mean()


def test_cuda_event_iteration_time_matches_a_synchronised_host_clock(tmp_path):
    net = Matmuls()
    data = DataLoader(TensorDataset(torch.randn(30 * 512, 2048)), batch_size=512)

    class Clock:
        priority = 0

        @hookimpl
        def before_train_iter(self, runner) -> None:
            if runner.iter == 10:  # past the timer's warm-up and the cuBLAS set-up
                torch.cuda.synchronize()
                self.start = time.perf_counter()

        @hookimpl
        def after_train_iter(self, runner) -> None:
            if runner.iter == 29:
                torch.cuda.synchronize()
                self.per_iter = (time.perf_counter() - self.start) / 20
                self.timer_time = runner.scalars.latest(["train/time"])["train/time"]

    clock = Clock()
    runner = Runner(
        net,
        data,
        optimizer=torch.optim.SGD(net.parameters(), lr=1e-4),
        max_epochs=1,
        work_dir=tmp_path,
        plugins={"timer": {"warmup": 5, "window": 20}, "logger": False, "checkpoint": False},
        hooks=[clock],
        writers=(),
        device="cuda",
    )
    assert runner.plugins["timer"].settings.cuda_events == "auto"
    runner.train()
    assert clock.timer_time == pytest.approx(clock.per_iter, rel=0.2)


def test_async_checkpoint_holds_the_weights_of_its_iteration(tmp_path):
    net = model()

    class Snapshot:
        priority = 100  # after the checkpoint plugin took its copy

        @hookimpl
        def after_train_iter(self, runner) -> None:
            if runner.iter == 9:
                self.weights = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}

    snap = Snapshot()
    runner = Runner(
        net,
        loader(),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.05),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        work_dir=tmp_path,
        plugins={"checkpoint": {"by_epoch": False, "interval": 10, "async_save": True}},
        hooks=[snap],
        writers=(),
        device="cuda",
    )
    runner.train()
    saved = torch.load(tmp_path / "checkpoints" / "iter_10.pt", weights_only=True)
    for name, tensor in snap.weights.items():
        assert torch.equal(saved["model"][name], tensor), name

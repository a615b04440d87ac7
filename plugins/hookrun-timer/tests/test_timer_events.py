"""The CUDA-event path, with stand-in events: values are read only when a logger reads them."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import hookrun_timer
import pytest

from hookrun import hookimpl


class FakeEvent:
    """Records the host clock; like a CUDA event on one stream, it cannot be timed until it, or
    an event recorded after it, was waited on."""

    syncs = 0
    completed = 0.0  # events recorded up to this clock have completed

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.syncs += 1
        FakeEvent.completed = max(FakeEvent.completed, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        if end.at > FakeEvent.completed:
            raise RuntimeError("event not complete")
        return (end.at - self.at) * 1000.0


class PretendCuda:
    """Shows the timer a CUDA device at before_run only (priority 0 runs before the timer)."""

    priority = 0

    @hookimpl
    def before_run(self, runner: Any) -> None:
        self.device, runner.device = runner.device, SimpleNamespace(type="cuda")

    @hookimpl
    def before_train(self, runner: Any) -> None:
        runner.device = self.device


class EveryFifth:
    """Reads the timer's scalars every 5 iterations, as a logger with interval 5."""

    priority = 100

    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []
        self.syncs_between: list[int] = []
        self.clock: list[float] = []

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self.clock.append(time.perf_counter())
        if (runner.iter + 1) % 5 == 0:
            before = FakeEvent.syncs
            self.values.append(runner.scalars.latest(["train/time", "train/throughput"]))
            self.syncs_between.append(FakeEvent.syncs - before)


def test_event_times_are_read_once_per_logging_interval(
    make_runner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hookrun_timer, "record_event", FakeEvent)
    FakeEvent.syncs = 0
    reader = EveryFifth()
    runner = make_runner(
        {"warmup": 2, "window": 5, "cuda_events": True},
        data=0.004,
        step=0.012,
        batches=20,
        batch_size=4,
        hooks=[PretendCuda(), reader],
    )
    runner.train()
    assert FakeEvent.syncs == 4  # one per read, none in between
    assert reader.syncs_between == [1, 1, 1, 1]
    last = reader.values[-1]
    assert last["train/time"] == pytest.approx((reader.clock[-1] - reader.clock[-6]) / 5, rel=0.1)
    assert last["train/throughput"] == pytest.approx(4 / last["train/time"], rel=1e-9)
    stored = runner.scalars.history("train/time")
    assert all(isinstance(value, hookrun_timer.Deferred) for value in stored)


def test_scalars_are_computed_when_read_not_every_iteration(make_runner: Any) -> None:
    runner = make_runner({"warmup": 1}, batches=4)
    runner.train()
    for name in ("train/time", "train/data_time", "train/throughput"):
        history = runner.scalars.history(name)
        assert all(isinstance(value, hookrun_timer.Deferred) for value in history), name
        assert type(float(history[-1])) is float and float(history[-1]) >= 0.0, name

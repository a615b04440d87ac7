"""Data time, iteration time and throughput against sleeps of known length."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hookrun import hookimpl

TIMER_KEYS = ("train/time", "train/data_time", "train/throughput")


class SlowHook:
    """An ad-hoc hook that spends ``delay`` seconds after every training iteration."""

    priority = 80

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @hookimpl
    def after_train_iter(self) -> None:
        time.sleep(self.delay)


class Reader:
    """Reads the timer's scalars after every iteration, as the core's report would."""

    priority = 100

    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []
        self.clock: list[float] = []
        self.end = 0.0

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self.values.append(runner.scalars.latest(TIMER_KEYS))
        self.clock.append(time.perf_counter())

    @hookimpl
    def after_train(self) -> None:
        self.end = time.perf_counter()


@pytest.mark.timing
def test_data_and_iteration_times_match_the_sleeps(make_runner: Any) -> None:
    data, step, hook, batch = 0.020, 0.020, 0.010, 4
    reader = Reader()
    runner = make_runner(
        {"warmup": 3, "window": 10},
        data=data,
        step=step,
        batches=20,
        batch_size=batch,
        hooks=[SlowHook(hook), reader],
    )
    runner.train()
    # warm-up iterations put nothing; every later one has all three scalars
    assert [set(v) for v in reader.values[:3]] == [set()] * 3
    assert all(set(v) == set(TIMER_KEYS) for v in reader.values[3:])
    last = reader.values[-1]
    # hook time is not data time, but it is part of the iteration
    assert last["train/data_time"] == pytest.approx(data, rel=0.3)
    assert last["train/time"] == pytest.approx(data + step + hook, rel=0.3)
    assert last["train/throughput"] == pytest.approx(batch / (data + step + hook), rel=0.3)
    # the throughput is the window's samples over the window's time
    assert last["train/throughput"] == pytest.approx(batch / last["train/time"], rel=1e-9)

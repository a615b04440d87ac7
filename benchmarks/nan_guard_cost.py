"""Per-iteration cost of the nan_guard plugin (tiny MLP, CPU): DESIGN §10 asks <= 1.03x.

The same Runner trains the same model on the same batches with no plugins, with
``nan_guard: {}`` (a fused check read on the host every step) and with ``check_every: 10``
(read every 10 steps). First the direct figure: the guard's work per step against a plain
training step, timed in tight loops. Then whole runs: they alternate and medians are
reported, of the main thread's CPU time
(``time.thread_time``: one intra-op thread, ``num_workers=0``; other processes on a shared
machine barely move it) and of wall time. ``plugin_cost`` is shared by the profiler and
memory benchmarks.

    python benchmarks/nan_guard_cost.py [--iters 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from typing import Any

import torch
from overhead import make_data, make_model
from torch import nn

from hookrun import Runner, hookimpl


def check_cost(guard: dict[str, Any], n: int = 5000, repeats: int = 5) -> tuple[float, float]:
    """Thread CPU seconds of the guard's per-step work (``before_backward`` and
    ``before_optimizer_step`` through the dispatcher) and of one plain training step (forward,
    backward, SGD step, zero_grad) on the same model and batch, best of ``repeats`` loops:
    direct figures, robust to other processes on the machine."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = next(iter(make_data(1)))
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            make_data(1),
            optimizer=optimizer,
            criterion=nn.CrossEntropyLoss(),
            max_iters=1,
            work_dir=work_dir,
            plugins={"nan_guard": guard},
            writers=(),
        )
    hooks = runner.hooks
    runner.mode = "train"
    hooks.before_train(runner=runner)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()

    def guard() -> None:
        hooks.before_backward(runner=runner, loss=loss.detach())
        hooks.before_optimizer_step(runner=runner, optimizer=optimizer)

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    best = []
    for work in (guard, step):
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            for _ in range(n):
                work()
            times.append((time.thread_time() - start) / n)
        best.append(min(times))
    return best[0], best[1]


class Timing:
    """Times the epoch from its first hook call to its end: wall and thread CPU seconds."""

    priority = 0

    @hookimpl
    def before_train_epoch(self) -> None:
        self.start = (time.perf_counter(), time.thread_time())

    @hookimpl
    def after_train_epoch(self) -> None:
        self.wall = time.perf_counter() - self.start[0]
        self.cpu = time.thread_time() - self.start[1]


def run(iters: int, plugins: dict[str, Any]) -> tuple[float, float]:
    """Wall and thread CPU seconds per iteration of one epoch of ``iters`` iterations."""
    model = make_model()
    timing = Timing()
    with tempfile.TemporaryDirectory() as work_dir:
        Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            log_interval=50,
            work_dir=work_dir,
            plugins=plugins,
            hooks=[timing],
            writers=(),
        ).train()
    return timing.wall / iters, timing.cpu / iters


def plugin_cost(cases: dict[str, dict[str, Any]], default_iters: int = 2000) -> None:
    """Measure ``cases`` (name -> plugins; the first is the baseline) alternately and print
    the median µs per iteration and the ratio to the baseline."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=default_iters)
    parser.add_argument("--repeats", type=int, default=5)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = "0"
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    with contextlib.redirect_stdout(io.StringIO()):  # plugins' console lines
        for plugins in cases.values():  # warm-up
            run(min(args.iters, 200), plugins)
        for _ in range(args.repeats):
            for name, plugins in cases.items():
                wall_s, cpu_s = run(args.iters, plugins)
                wall[name].append(wall_s)
                cpu[name].append(cpu_s)
    base = next(iter(cases))
    print(f"{args.iters} iterations x {args.repeats} alternating runs, torch {torch.__version__}")
    print(f"{'case':40s} {'CPU µs/it':>10s} {'ratio':>6s} {'wall µs/it':>11s} {'ratio':>6s}")
    for name in cases:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        c0, w0 = statistics.median(cpu[base]), statistics.median(wall[base])
        print(f"{name:40s} {c * 1e6:10.1f} {c / c0:6.3f} {w * 1e6:11.1f} {w / w0:6.3f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = "0"
    for guard in ({}, {"check_loss": False}):
        guard_s, step_s = check_cost(guard)
        print(
            f"direct, nan_guard: {guard}: its work per step {guard_s * 1e6:.1f} µs, a plain "
            f"training step {step_s * 1e6:.1f} µs: {guard_s / step_s:.1%} (thread CPU time, "
            "best of 5)"
        )
    plugin_cost(
        {
            "no plugins": {},
            "nan_guard (check every step)": {"nan_guard": {}},
            "nan_guard, check_every: 10": {"nan_guard": {"check_every": 10}},
        }
    )

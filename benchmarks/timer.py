"""Per-iteration cost of the timer plugin, without and with ``profile_hooks`` (tiny MLP, CPU).

Three Runner configurations train the same model on the same batches, each with an ad-hoc
hook reading the loss every 50 iterations (as a logger would): no plugins, the timer, and
the timer with ``profile_hooks: true``. Runs alternate and medians are reported, of wall time
and of the main thread's CPU time (``time.thread_time``: with one intra-op thread and
``num_workers=0`` all the work runs there, and other processes on a shared machine barely
move it). The timer's own hook time per iteration, measured by the hook profile, is printed
as well.

    python benchmarks/timer.py [--iters 3000] [--repeats 7]
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
from overhead import BATCH, CLASSES, FEATURES, HIDDEN, make_data, make_model
from torch import nn

from hookrun import Runner, hookimpl


class ReadLoss:
    """The loss read to the host every 50 iterations."""

    priority = 60

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.every_n_iters(50):
            runner.scalars.latest(["train/loss"])


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


def run(iters: int, plugins: dict[str, Any]) -> tuple[float, float, float, float]:
    """Wall and CPU seconds per iteration, and the seconds per iteration in the timer's hooks
    and in ReadLoss's one-line hook, for scale (both known in profiled runs only)."""
    model = make_model()
    timing = Timing()
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            plugins=plugins,
            hooks=[timing, ReadLoss()],
            writers=(),
        )
        runner.train()
    per_hook = runner.manager.stats.per_hook
    own = sum(
        per_hook.get(("timer", hook), (0, 0.0))[1]
        for hook in ("before_train_iter", "after_train_iter")
    )
    trivial = per_hook.get(("ReadLoss", "after_train_iter"), (0, 0.0))[1]
    return timing.wall / iters, timing.cpu / iters, own / iters, trivial / iters


def hook_cost(plugins: dict[str, Any], n: int = 20000, repeats: int = 5) -> float:
    """Thread CPU seconds of one iteration's before/after_train_iter dispatch, best of
    ``repeats`` loops: the direct figure, robust to other processes on the machine."""
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, CLASSES)
    loader = make_data(2)
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            loader,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
            criterion=nn.CrossEntropyLoss(),
            max_iters=10**9,
            work_dir=work_dir,
            plugins=plugins,
            writers=(),
        )
    batch = next(iter(loader))
    hooks = runner.hooks
    runner.mode = "train"
    hooks.before_run(runner=runner)
    hooks.before_train(runner=runner)
    outputs = {"loss": torch.zeros(())}
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for i in range(n):
            runner.iter = i
            hooks.before_train_iter(runner=runner, batch_idx=i, batch=batch)
            hooks.after_train_iter(runner=runner, batch_idx=i, batch=batch, outputs=outputs)
        best = min(best, (time.thread_time() - start) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = "0"
    cases = {
        "no plugins": {},
        "timer": {"timer": {}},
        "timer, profile_hooks": {"timer": {"profile_hooks": True}},
    }
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    own: list[float] = []
    trivial: list[float] = []
    with contextlib.redirect_stdout(io.StringIO()):  # the timer's summary lines
        for plugins in cases.values():  # warm-up
            run(args.iters, plugins)
        for _ in range(args.repeats):
            for name, plugins in cases.items():
                wall_s, cpu_s, timer_seconds, read_loss_seconds = run(args.iters, plugins)
                wall[name].append(wall_s)
                cpu[name].append(cpu_s)
                if plugins.get("timer", {}).get("profile_hooks"):
                    own.append(timer_seconds)
                    trivial.append(read_loss_seconds)
    print(
        f"torch {torch.__version__}, {args.iters} iterations x {args.repeats} alternating runs, "
        f"1 thread, MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH}"
    )
    for clock, times in (("wall", wall), ("thread CPU", cpu)):
        base = statistics.median(times["no plugins"])
        print(f"{clock + ' time':24s} {'us/iter':>9s} {'+us/iter':>9s} {'ratio':>7s}")
        for name, values in times.items():
            median = statistics.median(values)
            extra = (median - base) * 1e6
            print(f"{name:24s} {median * 1e6:9.1f} {extra:+9.1f} {median / base:7.3f}")
    print(
        f"timer's own hooks (before/after_train_iter, from the profile): "
        f"{statistics.median(own) * 1e6:.1f} us/iter; ReadLoss's one-line hook, for scale: "
        f"{statistics.median(trivial) * 1e6:.1f} us/iter"
    )
    print("direct: before/after_train_iter dispatch per iteration, thread CPU, best of 5")
    base = hook_cost({})
    for name, plugins in cases.items():
        cost = hook_cost(plugins)
        print(f"{name:24s} {cost * 1e6:9.2f} {(cost - base) * 1e6:+9.2f}")


if __name__ == "__main__":
    main()

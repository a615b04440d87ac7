"""Per-iteration overhead of the Runner against a hand-written loop (small MLP, CPU).

Both sides train the same model on the same batches and read the loss to the host every
50 iterations. Runs alternate (loop, bare, defaults, loop, ...) and medians are reported.
Budgets: bare runner <= 1.02x the loop; default plugins <= 1.03x (DESIGN §10).

    python benchmarks/overhead.py [--iters 3000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl

BATCH, FEATURES, HIDDEN, CLASSES = 32, 64, 128, 10


def make_data(iters: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(iters * BATCH, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (iters * BATCH,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def hand_loop(iters: int) -> float:
    """The loop a user writes by hand, with a .item() every 50 iterations."""
    model, loader = make_model(), make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    logged = []
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (i + 1) % 50 == 0:
            logged.append(loss.item())
    return (time.perf_counter() - start) / iters


class ReadLoss:
    """The same logging as the hand loop: the loss read every 50 iterations."""

    priority = 60

    def __init__(self) -> None:
        self.logged: list[float] = []

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(50):
            self.logged.append(runner.scalars.latest(["train/loss"])["train/loss"])


def runner_loop(iters: int, plugins: dict | None) -> float:
    model = make_model()
    timing = Timing()
    hooks = [timing] if plugins is None else [timing, ReadLoss()]
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            plugins=plugins,
            hooks=hooks,
            writers=() if plugins is not None else ("jsonl", "tensorboard"),
        )
        runner.train()
    return timing.elapsed / iters


class Timing:
    """Times the epoch from its first iteration to its end, as the hand loop is timed."""

    priority = 0

    @hookimpl
    def before_train_epoch(self):
        self.start = time.perf_counter()

    @hookimpl
    def after_train_epoch(self):
        self.elapsed = time.perf_counter() - self.start


def measure(cases: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median seconds per iteration of each case: one warm-up each, then alternating runs
    (console output of the contenders is swallowed)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for fn in cases.values():
            fn()
        for _ in range(repeats):
            for name, fn in cases.items():
                times[name].append(fn())
    return {name: statistics.median(values) for name, values in times.items()}


def report(title: str, medians: dict[str, float]) -> None:
    base = medians["hand-written loop"]
    print(title)
    print(f"{'case':28s} {'us/iter':>9s} {'overhead':>9s} {'ratio':>7s}")
    for name, median in medians.items():
        print(f"{name:28s} {median * 1e6:9.1f} {(median - base) * 1e6:+9.1f} {median / base:7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=7)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    cases = {
        "hand-written loop": lambda: hand_loop(args.iters),
        "hookrun, no plugins": lambda: runner_loop(args.iters, {}),
        "hookrun, default plugins": lambda: runner_loop(args.iters, None),
    }
    report(
        f"torch {torch.__version__}, {args.iters} iterations x {args.repeats} alternating runs, "
        f"1 thread, MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH}",
        measure(cases, args.repeats),
    )


if __name__ == "__main__":
    main()

"""Cost of hookrun's logging against a hand-written loop that logs the same things (CPU).

A 64-128-10 MLP, batch 32, one thread. Every 50 iterations both sides write the loss
smoothed over the last 20 iterations and the learning rate to TensorBoard (tensorboardX)
and a JSONL file, and print one console line (captured). When the timer plugin is
installed the runner's default plugins also log iteration time, data time, throughput
and ETA, so a second hand loop measures those with host clocks and logs them too.

Cases, alternated run by run, medians reported (µs per iteration, ratio to the hand loop
that does the same logging; budget <= 1.03, DESIGN §10):

- ``hookrun, hand logging hook``: the Runner, no plugins, the hand loop's logging block as an
  ad-hoc hook; against ``hookrun, logger only`` it isolates the logger's own cost.
- ``hookrun, logger only``: the Runner with just the logger (interval 50, window 20).
- ``hookrun, default plugins``: ``plugins=None`` -- every installed plugin enabled by
  default with default settings (logger, timer, checkpoint; ema and precise_bn blocked).
  The checkpoint plugin saves at the end of the epoch; the run is one epoch and timing
  stops in ``after_train_epoch`` at priority 0, before it saves, so no save is timed.

Each run uses a fresh temporary work_dir. ``python benchmarks/logger.py [--iters N] [--repeats R]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import torch
from overhead import BATCH, CLASSES, FEATURES, HIDDEN, make_data, make_model
from tensorboardX import SummaryWriter
from torch import nn

from hookrun import Runner, hookimpl

INTERVAL, WINDOW = 50, 20


def hand_loop(iters: int, timing: bool) -> tuple[float, float]:
    """What a user writes by hand: smoothed loss and lr (and, with ``timing``, the timer's
    four figures) to TensorBoard and JSONL plus a console line every 50 iterations."""
    model, loader = make_model(), make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as work_dir:
        tb = SummaryWriter(str(Path(work_dir) / "tensorboard"), max_queue=1000, flush_secs=30)
        log = (Path(work_dir) / "log.jsonl").open("a")
        losses: deque[torch.Tensor] = deque(maxlen=WINDOW)
        iter_times: deque[float] = deque(maxlen=WINDOW)
        data_times: deque[float] = deque(maxlen=WINDOW)
        start, start_cpu = time.perf_counter(), time.process_time()
        last = start
        for i, (x, y) in enumerate(loader):
            if timing:
                fetched = time.perf_counter()
                data_times.append(fetched - last)
            loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if timing:
                now = time.perf_counter()
                iter_times.append(now - last)
                last = now
            if (i + 1) % INTERVAL == 0:
                step = i + 1
                values = {
                    "train/loss": torch.stack(list(losses)).mean().item(),
                    "train/lr": optimizer.param_groups[0]["lr"],
                }
                if timing:
                    per_iter = sum(iter_times) / len(iter_times)
                    values["train/time"] = per_iter
                    values["train/data_time"] = sum(data_times) / len(data_times)
                    values["train/throughput"] = BATCH / per_iter
                    values["train/eta"] = per_iter * (iters - step)
                for name, value in values.items():
                    tb.add_scalar(name, value, step)
                log.write(json.dumps({"step": step, "time": round(time.time(), 3), **values}))
                log.write("\n")
                print(f"iter {step}/{iters}  loss {values['train/loss']:.4f}")
        elapsed = (time.perf_counter() - start, time.process_time() - start_cpu)
        tb.close()
        log.close()
    return elapsed[0] / iters, elapsed[1] / iters


class HandLogging:
    """The hand loop's logging block as an ad-hoc hook, with its own files (``writers=()``):
    the Runner with this hook instead of the logger isolates the logger's own cost."""

    priority = 60

    def __init__(self, work_dir: str, iters: int) -> None:
        self.tb = SummaryWriter(str(Path(work_dir) / "tb"), max_queue=1000, flush_secs=30)
        self.log = (Path(work_dir) / "hand.jsonl").open("a")
        self.losses: deque[torch.Tensor] = deque(maxlen=WINDOW)
        self.iters = iters

    @hookimpl
    def after_train_iter(self, runner, outputs) -> None:
        self.losses.append(outputs["loss"])
        if (runner.iter + 1) % INTERVAL == 0:
            step = runner.iter + 1
            values = {
                "train/loss": torch.stack(list(self.losses)).mean().item(),
                "train/lr": runner.optimizer.param_groups[0]["lr"],
            }
            for name, value in values.items():
                self.tb.add_scalar(name, value, step)
            self.log.write(json.dumps({"step": step, "time": round(time.time(), 3), **values}))
            self.log.write("\n")
            print(f"iter {step}/{self.iters}  loss {values['train/loss']:.4f}")

    @hookimpl
    def after_run(self) -> None:
        self.tb.close()
        self.log.close()


class Timing:
    """Times the epoch from its start to its end, as the hand loop is timed; runs first."""

    priority = 0

    @hookimpl
    def before_train_epoch(self) -> None:
        self.start = (time.perf_counter(), time.process_time())

    @hookimpl
    def after_train_epoch(self) -> None:
        self.elapsed = (
            time.perf_counter() - self.start[0],
            time.process_time() - self.start[1],
        )


def runner_loop(
    iters: int, plugins: dict | None, hand: bool = False
) -> tuple[tuple[float, float], list[str]]:
    """Wall and CPU seconds per iteration of the Runner, and the plugins that were active.
    ``hand``: log with ``HandLogging`` and no writers."""
    model = make_model()
    timing = Timing()
    with tempfile.TemporaryDirectory() as work_dir:
        hooks = [timing, HandLogging(work_dir, iters)] if hand else [timing]
        runner = Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            plugins=plugins,
            hooks=hooks,
            writers=() if hand else ("jsonl", "tensorboard"),
        )
        runner.train()
    wall, cpu = timing.elapsed
    return (wall / iters, cpu / iters), [
        n for n in runner.plugins if n not in ("Timing", "HandLogging")
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=21)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    os.environ.pop("HOOKRUN_PLUGINS_AUTOLOAD", None)
    from hookrun.hooks.discovery import installed_plugins

    installed = installed_plugins()
    timer = "timer" in installed
    logger_only = {name: False for name in installed if name != "logger"} | {"logger": {}}
    n = args.iters
    plain, timed = "hand loop, loss + lr", "hand loop, + timer figures"
    no_plugins = {name: False for name in installed}
    hooked = "hookrun, hand logging hook"
    cases = {
        plain: lambda: (hand_loop(n, timing=False), []),
        hooked: lambda: runner_loop(n, no_plugins, hand=True),
        "hookrun, logger only": lambda: runner_loop(n, logger_only),
    }
    if timer:
        cases[timed] = lambda: (hand_loop(n, timing=True), [])
    cases["hookrun, default plugins"] = lambda: runner_loop(n, None)
    baseline = {
        hooked: plain,
        "hookrun, logger only": plain,
        "hookrun, default plugins": timed if timer else plain,
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    active: dict[str, list[str]] = {}
    with contextlib.redirect_stdout(io.StringIO()):  # the console lines of both sides
        for name, fn in cases.items():  # warm-up
            active[name] = fn()[1]
        for _ in range(args.repeats):
            for name, fn in cases.items():
                times[name].append(fn()[0])
    print(
        f"torch {torch.__version__}, {n} iterations x {args.repeats} alternating runs, 1 thread, "
        f"MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH}, log every {INTERVAL}"
    )
    print(f"default plugins: {', '.join(active['hookrun, default plugins'])}")
    print("us/iter; wall = perf_counter, cpu = process_time (all threads); ratio to its hand loop")
    header = f"{'case':28s} {'wall med':>9s} {'ratio':>6s} {'wall min':>9s} {'ratio':>6s}"
    print(header + f" {'cpu med':>9s} {'ratio':>6s}")
    stats = {
        name: (
            statistics.median(w for w, _ in runs),
            min(w for w, _ in runs),
            statistics.median(c for _, c in runs),
        )
        for name, runs in times.items()
    }
    for name, figures in stats.items():
        ref = stats.get(baseline.get(name, ""))
        cells = [
            f"{value * 1e6:9.1f} " + (f"{value / ref[i]:6.3f}" if ref else " " * 6)
            for i, value in enumerate(figures)
        ]
        print(f"{name:28s} " + " ".join(cells))
    mine, theirs = stats["hookrun, logger only"], stats[hooked]
    print(
        "logger only / hand logging hook, both in the Runner: "
        f"wall min {mine[1] / theirs[1]:.3f}, cpu med {mine[2] / theirs[2]:.3f}"
    )


if __name__ == "__main__":
    main()

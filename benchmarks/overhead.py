"""Per-iteration overhead of the Runner against a hand-written loop (small MLP, CPU).

Both sides train the same model on the same batches and read the loss to the host every
50 iterations (the Runner's ``log_interval=50``: the core's report). Each round runs every
case once (in a rotating order); ratios are medians over rounds of the ratio within the round.
Budget (DESIGN §10): default plugins <= 1.03x the hand loop that calls .item() every 50
iterations.

    python benchmarks/overhead.py [--iters 2000] [--repeats 15] [--parts]

``--parts`` runs the default plugins' case against itself without each of its parts (the
writers, the timer, the logger, the checkpoint plugin) instead.
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
from collections.abc import Callable, Iterable

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


class OneEventWriter:
    """TensorBoard logging the way hookrun's writer does it: every interval's values in one
    event, written in the loop's thread (no queue, no helper threads)."""

    def __init__(self, log_dir: str) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        self.events = EventsWriter(os.path.join(log_dir, "events"))

    def write(self, values: dict[str, float], step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self.events.write_event(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        self.events.close()


class AddScalarWriter:
    """TensorBoard logging as tensorboardX documents it: ``SummaryWriter.add_scalar`` per value."""

    def __init__(self, log_dir: str) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(log_dir, max_queue=1000)

    def write(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


def hand_loop_logging(iters: int, one_event: bool = False) -> float:
    """The hand loop with what the default plugins log: every 50 iterations the loss
    averaged over the interval, lr, time per iteration, data time, throughput and ETA to TensorBoard
    and a JSONL file, and one console line."""
    model, loader = make_model(), make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    losses: deque[torch.Tensor] = deque(maxlen=50)
    with tempfile.TemporaryDirectory() as work_dir:
        writer = (OneEventWriter if one_event else AddScalarWriter)(work_dir)
        log = open(os.path.join(work_dir, "log.jsonl"), "a", buffering=1)  # noqa: SIM115
        start = last = time.perf_counter()
        data_time, fetched = 0.0, time.perf_counter()
        for i, (x, y) in enumerate(loader):
            data_time += time.perf_counter() - fetched
            loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if (i + 1) % 50 == 0:
                now = time.perf_counter()
                per_iter = (now - last) / 50
                values = {
                    "train/loss": torch.stack(list(losses)).mean().item(),
                    "train/lr": optimizer.param_groups[0]["lr"],
                    "train/time": per_iter,
                    "train/data_time": data_time / 50,
                    "train/throughput": BATCH / per_iter,
                    "train/eta": (iters - i - 1) * per_iter,
                }
                writer.write(values, i + 1)
                log.write(json.dumps({"step": i + 1, **values}) + "\n")
                print(f"iter {i + 1}/{iters} loss {values['train/loss']:.4f}")
                last, data_time = now, 0.0
            fetched = time.perf_counter()
        elapsed = time.perf_counter() - start
        writer.close()
        log.close()
    return elapsed / iters


def nothing() -> None:
    """A mark that does nothing (the timed loops' default ``marks``)."""


def hand_loop(
    iters: int,
    model: nn.Module | None = None,
    epochs: int = 1,
    marks: tuple[Callable[[], None], Callable[[], None]] = (nothing, nothing),
) -> float:
    """The loop a user writes by hand, with a .item() every 50 iterations (on ``model``, or
    a fresh ``make_model()``): seconds per iteration of its last epoch. ``marks`` are
    called at each epoch's start and end (the instruction counter's switch)."""
    model, loader = model if model is not None else make_model(), make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for _ in range(epochs):
        marks[0]()
        start = time.perf_counter()
        textbook_epoch(model, loader, optimizer, criterion)
        elapsed = time.perf_counter() - start
        marks[1]()
    return elapsed / iters


def textbook_epoch(
    model: nn.Module, loader: Iterable[tuple[torch.Tensor, torch.Tensor]], optimizer, criterion
) -> list[float]:
    """One epoch of the loop users write by hand, the loss read to the host every 50
    iterations: every benchmark's reference (DDP and FSDP pass their wrapped model)."""
    logged = []
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (i + 1) % 50 == 0:
            logged.append(loss.item())
    return logged


def runner_loop(
    iters: int,
    default_plugins: bool,
    loaded: bool = True,
    model: nn.Module | None = None,
    epochs: int = 1,
    marks: tuple[Callable[[], None], Callable[[], None]] = (nothing, nothing),
    without: str = "",
) -> float:
    """The Runner with every installed plugin off and no writer (the core's report every 50
    iterations is the hand loop's .item()), or with the default plugins and writers:
    seconds per iteration of its last epoch. ``loaded=False``: no plugin distribution
    loaded at all (autoload off), against which "every installed plugin off" shows what
    installed-but-disabled plugins cost. ``model``: trained instead of a fresh
    ``make_model()``; ``marks`` as the hand loop's. ``without``: one default plugin turned
    off, or ``"writers"`` (``--parts``)."""
    from hookrun.hooks.discovery import installed_plugins

    model = model if model is not None else make_model()
    timing = Timing(marks)
    plugins = None if default_plugins else dict.fromkeys(installed_plugins(), False)
    if default_plugins and without and without != "writers":
        plugins = {without: False}
    writers = ("jsonl", "tensorboard") if default_plugins and without != "writers" else ()
    autoload = os.environ.get("HOOKRUN_PLUGINS_AUTOLOAD")
    if not loaded:
        plugins, os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = {}, "0"
    try:
        with tempfile.TemporaryDirectory() as work_dir:
            runner = Runner(
                model,
                make_data(iters),
                optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                criterion=nn.CrossEntropyLoss(),
                max_epochs=epochs,
                work_dir=work_dir,
                plugins=plugins,
                hooks=[timing],
                writers=writers,
                log_interval=50,
            )
            runner.train()
    finally:
        if autoload is None:
            os.environ.pop("HOOKRUN_PLUGINS_AUTOLOAD", None)
        else:
            os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = autoload
    return timing.elapsed / iters


class Timing:
    """Times each epoch from its first iteration to its end, as the hand loop is timed,
    calling ``marks`` at both ends."""

    priority = 0

    def __init__(
        self, marks: tuple[Callable[[], None], Callable[[], None]] = (nothing, nothing)
    ) -> None:
        self.marks = marks

    @hookimpl
    def before_train_epoch(self):
        self.marks[0]()
        self.start = time.perf_counter()

    @hookimpl
    def after_train_epoch(self):
        self.elapsed = time.perf_counter() - self.start
        self.marks[1]()


Rounds = dict[str, list[float]]


def measure(cases: dict[str, Callable[[], float]], repeats: int) -> Rounds:
    """Seconds per iteration of each case in each round: one warm-up each, then rounds that
    run every case once, in a rotating order (console output of the contenders is swallowed)."""
    times: Rounds = {name: [] for name in cases}
    names = list(cases)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for fn in cases.values():
            fn()
        for i in range(repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                times[name].append(cases[name]())
    return times


def ratios(times: Rounds, case: str, base: str) -> list[float]:
    """case / base in each round, sorted: runs a few seconds apart, so the machine's slow
    drifts (other tenants, clocks) cancel."""
    return sorted(a / b for a, b in zip(times[case], times[base], strict=True))


def paired(times: Rounds, case: str, base: str) -> float:
    """Median over rounds of case / base: steadier than a ratio of medians."""
    return statistics.median(ratios(times, case, base))


def report(title: str, times: Rounds) -> None:
    print(title)
    header = f"{'case':46s} {'us/iter':>9s} {'ratio':>7s}  {'middle half of the rounds':>25s}"
    print(f"{header} {'fastest':>8s}")
    hand = min(times["hand-written loop"])
    for name, values in times.items():
        each = ratios(times, name, "hand-written loop")
        quarter = len(each) // 4
        spread = f"{each[quarter]:.3f}-{each[-1 - quarter]:.3f}"
        micros, ratio = statistics.median(values) * 1e6, statistics.median(each)
        print(f"{name:46s} {micros:9.1f} {ratio:7.3f}  {spread:>25s} {min(values) / hand:8.3f}")
    print(
        "us/iter: median over rounds; ratio: median over rounds of the ratio to the hand loop; "
        "middle half: its rounds' ratios from the first quartile to the third; fastest: the "
        "case's fastest round over the hand loop's (a busy machine only ever adds time)"
    )
    print(f"machine load average at the end: {os.getloadavg()[0]:.2f}")
    if LOGGING_ADD_SCALAR not in times:  # peers.py: the table alone
        return
    defaults = "hookrun, default plugins"
    print(
        f"default plugins / hand loop with .item() every 50: "
        f"{paired(times, defaults, 'hand-written loop'):.3f} (budget 1.03); "
        f"/ hand loop + the same logging: "
        f"{paired(times, defaults, LOGGING_ADD_SCALAR):.3f} with add_scalar, "
        f"{paired(times, defaults, LOGGING_ONE_EVENT):.3f} with one event per interval"
    )
    print(
        "installed plugins, all disabled / none loaded: "
        f"{paired(times, 'hookrun, no plugins', NOT_LOADED):.3f} (budget: 1.000, nothing per "
        "iteration)"
    )


NOT_LOADED = "hookrun, no plugin distribution loaded"
LOGGING_ADD_SCALAR = "hand-written loop + logging (add_scalar)"
LOGGING_ONE_EVENT = "hand-written loop + logging (one event)"
PARTS = ("writers", "timer", "logger", "checkpoint")
"""What ``--parts`` leaves out of the default run, one at a time."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--parts", action="store_true", help="the default run without each of its parts in turn"
    )
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    if args.parts:
        parts(args.iters, args.repeats)
        return
    cases = {
        "hand-written loop": lambda: hand_loop(args.iters),
        "hookrun, no plugins": lambda: runner_loop(args.iters, False),
        NOT_LOADED: lambda: runner_loop(args.iters, False, loaded=False),
        LOGGING_ADD_SCALAR: lambda: hand_loop_logging(args.iters),
        LOGGING_ONE_EVENT: lambda: hand_loop_logging(args.iters, one_event=True),
        "hookrun, default plugins": lambda: runner_loop(args.iters, True),
    }
    report(
        f"torch {torch.__version__}, {args.iters} iterations x {args.repeats} rounds, "
        f"1 thread, MLP {FEATURES}-{HIDDEN}-{CLASSES}, batch {BATCH}",
        measure(cases, args.repeats),
    )


def parts(iters: int, repeats: int) -> None:
    """Where the default plugins' cost goes: the default run against itself without the
    writers, the timer, the logger or the checkpoint plugin, in the same rounds."""
    defaults = "hookrun, default plugins"
    cases = {
        "hand-written loop": lambda: hand_loop(iters),
        "hookrun, no plugins": lambda: runner_loop(iters, False),
        defaults: lambda: runner_loop(iters, True),
    }
    for part in PARTS:
        cases[f"default plugins without the {part}"] = lambda part=part: runner_loop(
            iters, True, without=part
        )
    times = measure(cases, repeats)
    report(f"torch {torch.__version__}, {iters} iterations x {repeats} rounds: --parts", times)
    for part in PARTS:
        share = paired(times, defaults, f"default plugins without the {part}") - 1
        print(f"the {part}: {100 * share:+.1f} % of the default run (median of the rounds)")


if __name__ == "__main__":
    main()

"""The GPU check: one command, one table, on a machine with a CUDA device.

Measures what only a GPU shows: host-device synchronisations between log intervals with the
default plugins (counted with ``torch.cuda.set_sync_debug_mode("warn")``; 0 is the budget),
a ResNet-18-sized model's time per iteration under hookrun against a hand-written loop in
fp32, bf16 and fp16 with ``GradScaler``, the nan-guard's cost, the timer's CUDA-event
iteration time against a synchronised host clock, and a compiled model against the same
compiled hand loop. Runs unattended in a few minutes. Without a CUDA device it says so and
exits 0 (``--cpu-check`` runs every part on the CPU with tiny sizes and dynamo's ``eager``
backend, to check the script itself: its figures mean nothing).

    python benchmarks/gpu.py [--iters 120] [--repeats 3] [--cpu-check]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl

LOG_INTERVAL = 20
WARM = 10  # iterations left out of every timing (cuDNN autotuning, allocator, compilation)


class Sizes:
    """Image side, batch, number of batches in the data pool, ResNet width; the compiler's
    backend (``--cpu-check``: dynamo's ``eager``, which traces without inductor's code
    generation, minutes of C++ compilation on a CPU)."""

    def __init__(self, cpu_check: bool) -> None:
        self.backend = "eager" if cpu_check else "inductor"
        self.side, self.batch, self.pool, self.width = (
            (16, 4, 4, 8) if cpu_check else (96, 64, 16, 64)
        )


class Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def resnet18(width: int, classes: int = 10) -> nn.Module:
    """ResNet-18's layout (2-2-2-2 blocks, widths w..8w): 11.2 M parameters at w=64."""
    torch.manual_seed(0)
    widths = [width, width * 2, width * 4, width * 8]
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
    ]
    cin = width
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def data(sizes: Sizes) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = sizes.pool * sizes.batch
    x = torch.randn(n, 3, sizes.side, sizes.side, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    pin = torch.cuda.is_available()
    return DataLoader(TensorDataset(x, y), batch_size=sizes.batch, shuffle=True, pin_memory=pin)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def optimizer_for(model: nn.Module, amp: str | None, device: torch.device) -> torch.optim.Optimizer:
    # fp16's GradScaler reads found_inf to the host in step() unless the optimizer is fused
    fused = amp == "fp16" and device.type == "cuda"
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=fused)


def hand_loop(
    sizes: Sizes, iters: int, amp: str | None, device: torch.device, compiled: bool
) -> float:
    """Seconds per iteration after ``WARM`` of the loop a user writes by hand: autocast and
    a GradScaler as hookrun's ``amp`` does, the loss read every ``LOG_INTERVAL``."""
    model = resnet18(sizes.width).to(device)
    if compiled:
        model.compile(backend=sizes.backend)
    optimizer = optimizer_for(model, amp, device)
    criterion = nn.CrossEntropyLoss()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp or "")
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    batches = cycle(data(sizes))
    logged = []
    for i in range(iters):
        if i == WARM:
            sync(device)
            start = time.perf_counter()
        x, y = (t.to(device, non_blocking=True) for t in next(batches))
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if (i + 1) % LOG_INTERVAL == 0:
            logged.append(loss.item())
    sync(device)
    return (time.perf_counter() - start) / (iters - WARM)


def cycle(loader: DataLoader) -> Iterator[Any]:
    for _ in itertools.count():
        yield from loader


class Clock:
    """Times iterations ``WARM`` to the last with the device synchronised at both ends."""

    priority = 0

    def __init__(self, iters: int, device: torch.device) -> None:
        self.iters, self.device = iters, device

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == WARM:
            sync(self.device)
            self.start = time.perf_counter()

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == self.iters - 1:
            sync(self.device)
            self.per_iter = (time.perf_counter() - self.start) / (self.iters - WARM)
            self.timer = runner.scalars.latest(["train/time"]).get("train/time")


class SyncCounter:
    """Counts host-device synchronisations from iteration ``WARM`` on, except in the
    iterations that report (the logger reads its interval's values there) and past the last
    iteration (saves, summaries)."""

    priority = 0

    def __init__(self, iters: int) -> None:
        self.iters, self.caught = iters, warnings.catch_warnings(record=True)
        self.found: list[str] = []

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if WARM <= runner.iter < self.iters - 1 and not self.reports(runner.iter):
            self.records = self.caught.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if WARM <= runner.iter < self.iters - 1 and not self.reports(runner.iter):
            torch.cuda.set_sync_debug_mode(0)
            self.caught.__exit__(None, None, None)
            self.found += [str(w.message) for w in self.records if "synchroniz" in str(w.message)]

    @staticmethod
    def reports(iteration: int) -> bool:
        return (iteration + 1) % LOG_INTERVAL == 0


def runner_loop(
    sizes: Sizes,
    iters: int,
    amp: str | None,
    device: torch.device,
    compiled: bool = False,
    plugins: dict[str, Any] | None = None,
    count_syncs: bool = False,
) -> tuple[float, float | None, int]:
    """hookrun with its default plugins and writers (``plugins`` added): seconds per
    iteration after ``WARM``, the timer's ``train/time`` then, synchronisations counted."""
    model = resnet18(sizes.width)
    if compiled:
        model.compile(backend=sizes.backend)
    clock = Clock(iters, device)
    hooks: list[object] = [clock]
    counter = SyncCounter(iters)
    if count_syncs:
        hooks.append(counter)
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            data(sizes),
            optimizer=optimizer_for(model, amp, device),
            criterion=nn.CrossEntropyLoss(),
            max_iters=iters,
            work_dir=work_dir,
            plugins=plugins,
            hooks=hooks,
            amp=amp,
            device=device.type,
            log_interval=LOG_INTERVAL,
        )
        runner.train()
    return clock.per_iter, clock.timer, len(counter.found)


def median_pair(
    hand: Callable[[], float], ours: Callable[[], float], repeats: int
) -> tuple[float, float, float]:
    """Medians of both sides over rounds run in turn (hand, hookrun, hand, ...), and the
    median of the ratio within each round."""
    pairs = [(hand(), ours()) for _ in range(repeats)]
    return (
        statistics.median(h for h, _ in pairs),
        statistics.median(o for _, o in pairs),
        statistics.median(o / h for h, o in pairs),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-check", action="store_true", help="tiny sizes on the CPU")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_check:
        print("benchmarks/gpu.py: no CUDA device on this machine; nothing measured")
        return
    device = torch.device("cpu" if args.cpu_check else "cuda")
    sizes, iters = Sizes(args.cpu_check), args.iters
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"  # as benchmarks/overhead.py
    began = time.perf_counter()
    rows: dict[str, str] = {}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        for amp in (None, "bf16", "fp16") if device.type == "cuda" else (None, "bf16"):
            hand, ours, ratio = median_pair(
                lambda amp=amp: hand_loop(sizes, iters, amp, device, False),
                lambda amp=amp: runner_loop(sizes, iters, amp, device)[0],
                args.repeats,
            )
            name = amp or "fp32"
            key = f"ResNet-18 {name}: hand / hookrun ms per iteration, ratio"
            rows[key] = f"{hand * 1e3:.2f} / {ours * 1e3:.2f}, {ratio:.3f}"
            if device.type == "cuda":
                syncs = runner_loop(sizes, iters, amp, device, count_syncs=True)[2]
                rows[f"{name}: syncs between log intervals, default plugins"] = str(syncs)
        plain, guarded = (
            statistics.median(
                runner_loop(sizes, iters, None, device, plugins=plugins)[0]
                for _ in range(args.repeats)
            )
            for plugins in (None, {"nan_guard": True})
        )
        rows["nan-guard: ms per iteration added (fp32)"] = f"{(guarded - plain) * 1e3:.3f}"
        per_iter, timer, _ = runner_loop(sizes, iters, None, device)
        timer_ms = (timer or float("nan")) * 1e3
        rows["timer train/time / synchronised host clock, ms"] = (
            f"{timer_ms:.2f} / {per_iter * 1e3:.2f}"
        )
        compile_start = time.perf_counter()
        hand, ours, ratio = median_pair(
            lambda: hand_loop(sizes, iters, None, device, True),
            lambda: runner_loop(sizes, iters, None, device, compiled=True)[0],
            args.repeats,
        )
        key = "compiled ResNet-18 fp32: hand / hookrun ms per iteration, ratio"
        rows[key] = f"{hand * 1e3:.2f} / {ours * 1e3:.2f}, {ratio:.3f}"
        compiling = time.perf_counter() - compile_start
        rows["compiled part, wall seconds (compilation included)"] = f"{compiling:.0f}"
    name = (
        torch.cuda.get_device_name() if device.type == "cuda" else "CPU (--cpu-check: meaningless)"
    )
    print(
        f"{name}, torch {torch.__version__}, {iters} iterations ({WARM} warm-up left out), "
        f"batch {sizes.batch} of 3x{sizes.side}x{sizes.side}, medians of {args.repeats}"
    )
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:{width}s}  {value}")
    print(f"total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()

"""Per-iteration overhead of the Runner under 2-rank DDP (gloo, CPU) against a hand DDP loop.

Both sides train the same small MLP with DDP over a ``DistributedSampler`` and read the loss
to the host every 50 iterations; the Runner runs with its default plugins (logger, timer,
checkpoint saving at the epoch's end, outside the timed region). Each round runs both cases
once, in alternating order; the ratio is the median over rounds of the ratio within a round.
Issue 15's budget: within 5 % of the hand loop.

    python benchmarks/ddp_overhead.py [--iters 600] [--repeats 7]

It starts ``torchrun --nproc-per-node=2`` on itself.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from overhead import textbook_epoch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hookrun import Runner, hookimpl

BATCH, FEATURES, HIDDEN, CLASSES = 32, 64, 128, 10


def make_data(iters: int, world: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(iters * BATCH * world, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (iters * BATCH * world,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def hand_loop(iters: int) -> float:
    """Seconds per iteration of a hand DDP loop with ``.item()`` every 50 iterations."""
    world = dist.get_world_size()
    loader = make_data(iters, world)
    sampler = DistributedSampler(loader.dataset, shuffle=True, seed=0)
    loader = DataLoader(loader.dataset, batch_size=BATCH, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    dist.barrier()
    start = time.perf_counter()
    textbook_epoch(model, loader, optimizer, criterion)
    dist.barrier()
    return (time.perf_counter() - start) / len(loader)


class EpochClock:
    """Ad-hoc hook: the epoch's training time, from its start to its end (all ranks)."""

    priority = 0

    def __init__(self) -> None:
        self.seconds = 0.0
        self.start = 0.0

    @hookimpl
    def before_train_epoch(self) -> None:
        dist.barrier()
        self.start = time.perf_counter()

    @hookimpl
    def after_train_epoch(self) -> None:
        dist.barrier()
        self.seconds = time.perf_counter() - self.start


def runner_loop(iters: int) -> float:
    """Seconds per iteration of ``Runner.train`` with the default plugins under DDP."""
    clock = EpochClock()
    model = make_model()
    loader = make_data(iters, dist.get_world_size())
    with tempfile.TemporaryDirectory() as work_dir, contextlib.redirect_stdout(io.StringIO()):
        runner = Runner(
            model,
            loader,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            log_interval=50,
            work_dir=os.path.join(work_dir, f"rank{dist.get_rank()}"),
            hooks=[clock],
        )
        runner.train()
    return clock.seconds / iters


def worker(iters: int, repeats: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    hand_loop(iters // 4)  # warm-up of both paths
    runner_loop(iters // 4)
    hands, runs, ratios = [], [], []
    for round_ in range(repeats):
        cases = [hand_loop, runner_loop] if round_ % 2 == 0 else [runner_loop, hand_loop]
        times = {case.__name__: case(iters) for case in cases}
        hands.append(times["hand_loop"])
        runs.append(times["runner_loop"])
        ratios.append(times["runner_loop"] / times["hand_loop"])
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}, 2 ranks (gloo, CPU, 1 thread each), {iters} iterations")
        print(f"{'case':<44}{'us/iter':>10}")
        print(f"{'hand DDP loop (.item() every 50)':<44}{statistics.median(hands) * 1e6:>10.1f}")
        print(f"{'hookrun, default plugins':<44}{statistics.median(runs) * 1e6:>10.1f}")
        print(f"ratio (median over {repeats} rounds): {statistics.median(ratios):.3f}")
        print("every round's ratio, sorted: " + " ".join(f"{r:.3f}" for r in sorted(ratios)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args.iters, args.repeats)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", __file__, "--iters", str(args.iters)]
    command += ["--repeats", str(args.repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    raise SystemExit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()

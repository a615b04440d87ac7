"""``strategy: fsdp`` under 2-rank torchrun (gloo, CPU): the Runner against a hand FSDP2 loop,
and checkpoint save/load sharded (DCP folders) against gathered (one file from rank 0).

1. Per-iteration time, for a small and a large model: both sides shard the same model the same
   way (the small MLP 64-256-256-10: every ``Linear``, then the root; the large one, residual
   blocks of width 512: every block, then the root), train it over a ``DistributedSampler``
   and read the loss to the host every 50 iterations; the Runner runs with its default
   plugins (logger, timer, checkpoint saving at the epoch's end, outside the timed region).
   Each round runs both cases once, in alternating order (a busy neighbour hits both alike);
   the ratio is the median over rounds of the ratio within a round, every round's ratio is
   printed as the spread. DESIGN §10's budget: within 5 % of the hand loop. A small model
   shows a fixed per-iteration cost that a large one hides.
2. Checkpoints of a model of ``--mb`` megabytes of parameters (SGD with momentum: as much
   again of optimizer state): ``runner.save_checkpoint`` / ``load_checkpoint`` writing and
   reading a sharded folder, against gathering the full state dict to rank 0, writing it with
   ``torch.save`` and loading it on every rank.

    python benchmarks/fsdp.py [--iters 300] [--repeats 5] [--mb 256]

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
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from overhead import textbook_epoch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from hookrun import Runner, hookimpl

BATCH, CLASSES = 32, 10


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


def residual(width: int, blocks: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(width) for _ in range(blocks)], nn.Linear(width, CLASSES))


def small_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, CLASSES)
    )


class Model:
    """A model to time: how to build it, its input width, the class sharded per unit."""

    def __init__(self, name: str, build: Callable[[], nn.Module], features: int, unit: str):
        self.name, self.build, self.features, self.unit = name, build, features, unit


MODELS = [
    Model("small MLP 64-256-256-10, every Linear", small_mlp, 64, "Linear"),
    Model("large: 4 residual blocks of width 512", lambda: residual(512, 4), 512, "Block"),
]


def make_data(iters: int, world: int, features: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(iters * BATCH * world, features, generator=g)
    y = torch.randint(0, CLASSES, (iters * BATCH * world,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def shard(model: nn.Module, unit: str) -> nn.Module:
    """As the Runner's ``fsdp: {wrap: [unit]}`` does: each unit, then the root."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in model.modules():
        if type(module).__name__ == unit and module is not model:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def hand_loop(spec: Model, iters: int) -> float:
    """Seconds per iteration of a hand FSDP2 loop with ``.item()`` every 50 iterations."""
    loader = make_data(iters, dist.get_world_size(), spec.features)
    sampler = DistributedSampler(loader.dataset, shuffle=True, seed=0)
    loader = DataLoader(loader.dataset, batch_size=BATCH, sampler=sampler)
    model = shard(spec.build(), spec.unit)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    dist.barrier()
    start = time.perf_counter()
    textbook_epoch(model, loader, optimizer, criterion)
    dist.barrier()
    return (time.perf_counter() - start) / len(loader)


class EpochClock:
    """Ad-hoc hook: the epoch's training time, from its start to its end (all ranks)."""

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


def runner_loop(spec: Model, iters: int) -> float:
    """Seconds per iteration of ``Runner.train`` with the default plugins under FSDP."""
    clock = EpochClock()
    model = spec.build()
    loader = make_data(iters, dist.get_world_size(), spec.features)
    with tempfile.TemporaryDirectory() as work_dir, contextlib.redirect_stdout(io.StringIO()):
        runner = Runner(
            model,
            loader,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            log_interval=50,
            work_dir=_shared(work_dir),
            hooks=[clock],
            strategy="fsdp",
            fsdp={"wrap": [spec.unit]},
        )
        runner.train()
    return clock.seconds / iters


def _shared(local: str) -> str:
    """Rank 0's temporary folder on every rank (a sharded checkpoint is one folder)."""
    names = [local]
    dist.broadcast_object_list(names, src=0)
    return names[0]


def checkpoints(mb: int) -> dict[str, float]:
    """Seconds to save and load ``mb`` MB of parameters (plus momentum), both ways."""
    width = 1024
    blocks = max(1, round(mb * 2**20 / (4 * (width * width + width))))
    model = residual(width, blocks)
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        folder = Path(_shared(tmp))
        runner = Runner(
            model,
            make_data(1, dist.get_world_size(), width),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_iters=1,
            work_dir=folder / "run",
            writers=(),
            strategy="fsdp",
            fsdp={"wrap": ["Block"]},
        )
        runner.train()  # momentum buffers exist
        times["sharded save"] = _timed(lambda: runner.save_checkpoint(folder / "sharded.pt"))
        times["sharded load"] = _timed(lambda: runner.load_checkpoint(folder / "sharded.pt"))
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        path = folder / "gathered.pt"

        def save_gathered() -> None:
            weights, optim = get_state_dict(runner.model, runner.optimizer, options=full)
            if dist.get_rank() == 0:
                torch.save({"model": weights, "optimizer": optim}, path)

        def load_gathered() -> None:
            state = torch.load(path, weights_only=True, mmap=True)
            options = StateDictOptions(full_state_dict=True)
            set_state_dict(
                runner.model,
                runner.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
                options=options,
            )

        times["gathered save"] = _timed(save_gathered)
        times["gathered load"] = _timed(load_gathered)
        times["MB"] = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    return times


def _timed(fn: object) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    dist.barrier()
    return time.perf_counter() - start


def worker(iters: int, repeats: int, mb: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    lines = [f"torch {torch.__version__}, 2 ranks (gloo, CPU, 1 thread each), {iters} iterations"]
    for spec in MODELS:
        hand_loop(spec, iters // 4)  # warm-up of both paths
        runner_loop(spec, iters // 4)
        hands, runs, ratios = [], [], []
        for round_ in range(repeats):
            cases = [hand_loop, runner_loop] if round_ % 2 == 0 else [runner_loop, hand_loop]
            times = {case.__name__: case(spec, iters) for case in cases}
            hands.append(times["hand_loop"])
            runs.append(times["runner_loop"])
            ratios.append(times["runner_loop"] / times["hand_loop"])
        lines += [
            f"{spec.name}: hand FSDP2 loop {statistics.median(hands) * 1e6:.1f} us/iter, "
            f"hookrun (default plugins) {statistics.median(runs) * 1e6:.1f} us/iter",
            f"  ratio (median over {repeats} rounds): {statistics.median(ratios):.3f}; "
            "every round's, sorted: " + " ".join(f"{r:.3f}" for r in sorted(ratios)),
        ]
    saves = checkpoints(mb)
    if dist.get_rank() == 0:
        print("\n".join(lines))
        print(f"checkpoint of {saves.pop('MB'):.0f} MB of parameters + SGD momentum:")
        for name, seconds in saves.items():
            print(f"  {name:<20}{seconds * 1e3:>10.0f} ms")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mb", type=int, default=256)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args.iters, args.repeats, args.mb)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", __file__, "--iters", str(args.iters)]
    command += ["--repeats", str(args.repeats), "--mb", str(args.mb)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    raise SystemExit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()

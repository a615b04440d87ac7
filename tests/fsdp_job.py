"""Two-process jobs for the FSDP tests; run them under torchrun.

Usage: torchrun --nproc-per-node=2 fsdp_job.py WORK_DIR compare
   (a DDP run, then the same run under FSDP, in one process group: weights, metrics and the
   hook points each rank saw, saved by rank 0 for the test to compare)

Also the task of the CLI test's config (``task: fsdp_job.py:build``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl
from hookrun.fsdp import full_state_dict


class Block(nn.Module):
    """The unit the tests shard by class name (``fsdp: {wrap: [Block]}``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), Block(16), Block(16), nn.Linear(16, 2)
    )


def data(n: int, seed: int, shuffle: bool) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=shuffle)


def accuracy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.argmax(1) == y).float().mean()


def build(lr: float = 0.01) -> dict[str, Any]:
    """The CLI test's task: 9 validation samples give rank 0 two batches and rank 1 one."""
    net = model()
    return {
        "model": net,
        "train_dataloader": data(40, 1, shuffle=True),
        "val_dataloader": data(9, 2, shuffle=False),
        "optimizer": torch.optim.AdamW(net.parameters(), lr=lr),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": accuracy},
    }


class Recorder:
    """The hook points this rank saw, in order, with the iteration each came at."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def note(self, name: str, runner: Any) -> None:
        self.calls.append(f"{name}@{runner.iter}")

    @hookimpl
    def before_train_epoch(self, runner: Any) -> None:
        self.note("before_train_epoch", runner)

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self.note("after_train_iter", runner)

    @hookimpl
    def before_optimizer_step(self, runner: Any) -> None:
        self.note("before_optimizer_step", runner)

    @hookimpl
    def after_optimizer_step(self, runner: Any) -> None:
        self.note("after_optimizer_step", runner)

    @hookimpl
    def after_val_iter(self, runner: Any) -> None:
        self.note("after_val_iter", runner)

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        self.note("after_val_epoch", runner)


def compare(work_dir: Path) -> None:
    """The same run under DDP and under FSDP (wrap by class, accumulation, clipping)."""
    results: dict[str, Any] = {}
    for strategy in ("ddp", "fsdp"):
        task = build()  # SGD: AdamW would magnify the rounding noise of a zero gradient
        task["optimizer"] = torch.optim.SGD(task["model"].parameters(), lr=0.05, momentum=0.9)
        rec = Recorder()
        runner = Runner(
            **task,
            max_epochs=2,
            grad_accum=2,
            clip_grad=0.05,
            log_interval=5,
            work_dir=work_dir / strategy,
            writers=("jsonl",),
            hooks=[rec],
            strategy=strategy,
            fsdp={"wrap": ["Block"]},
            seed=3,
        )
        runner.train()
        weights = (
            full_state_dict(runner.model)
            if strategy == "fsdp"
            else runner.unwrapped_model.state_dict()
        )
        results[strategy] = {
            "weights": {k: v.detach().clone() for k, v in weights.items()},
            "metrics": runner.last_metrics["val"],
            "calls": rec.calls,
            "sharded": [type(p).__name__ for p in runner.model.parameters()],
        }
    rank = torch.distributed.get_rank()
    torch.save(results, work_dir / f"compare_rank{rank}.pt")
    torch.save(model().state_dict(), work_dir / "start.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("job", choices=["compare"])
    args = parser.parse_args()
    compare(args.work_dir)


if __name__ == "__main__":
    main()

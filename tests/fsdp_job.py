"""The FSDP tests' task and jobs; run under torchrun.

``build`` is the task of the CLI tests' config (``task: fsdp_job.py:build``); ``RUN`` the
runner settings they share. ``torchrun --nproc-per-node=2 fsdp_job.py WORK_DIR`` trains the
same run under DDP, then under FSDP, in one process group (``ddp/``, ``fsdp/``), then both
again with built-in plugins (``plugins_ddp/``, ``plugins_fsdp/``), resumes the DDP run's
file checkpoint under FSDP (``from_file/``), and tries the EMA plugin under FSDP (its error
in ``ema_rank<N>.txt``). Every run writes what the tests
compare (weights, metrics, the hook points each rank saw) to ``result_rank<N>.pt`` in its
work dir.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import ConfigError, Runner, hookimpl
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


#: the runner settings of every run here (the CLI tests' ``runner:`` section too)
RUN: dict[str, Any] = {
    "max_epochs": 2,
    "grad_accum": 2,
    "clip_grad": 0.05,
    "log_interval": 5,
    "writers": ["jsonl"],
    "strategy": "fsdp",
    "fsdp": {"wrap": ["Block"]},
    "seed": 3,
}


#: the built-in plugins of the ``plugins_*`` runs
PLUGINS = {
    "checkpoint": {"max_keep": 1, "save_best": "accuracy"},
    "timer": {"warmup": 1, "window": 3},
    "logger": {},
    "precise_bn": {"num_batches": 4},
}


def build(kill_in_save: int | None = None) -> dict[str, Any]:
    """40 samples (5 batches of 4 per rank and epoch); 9 validation samples give rank 0
    two batches and rank 1 one. SGD with momentum: AdamW would magnify the rounding noise of
    a gradient that is zero (the first layer's bias, before BatchNorm)."""
    net = model()
    return {
        "model": net,
        "train_dataloader": data(40, 1, shuffle=True),
        "val_dataloader": data(9, 2, shuffle=False),
        "optimizer": torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": accuracy},
        "hooks": [Recorder(), SaveAt(kill_in_save)],
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

    @hookimpl
    def after_train(self, runner: Any) -> None:
        """What the tests compare, from every rank (the full weights gathered under FSDP)."""
        sharded = runner.strategy == "fsdp"
        weights = full_state_dict(runner.model) if sharded else runner.unwrapped_model.state_dict()
        result = {
            "weights": {k: v.detach().clone() for k, v in weights.items()},
            "metrics": runner.last_metrics["val"],
            "calls": self.calls,
            "sharded": [type(p).__name__ for p in runner.model.parameters()],
            "resumed_from": str(runner.resumed_from),
        }
        torch.save(result, runner.work_dir / f"result_rank{runner.rank}.pt")


class SaveAt:
    """A checkpoint after iterations 4, 7 and 9 (each closes an accumulation group: 5
    batches per epoch in groups of 2, the epoch's last alone) through
    ``runner.save_checkpoint``; with
    ``kill_in_save``, rank 1 is SIGKILLed inside that save, right after DCP wrote its shard
    (before ``.metadata``), and torchrun ends rank 0."""

    def __init__(self, kill_in_save: int | None) -> None:
        self.kill_in_save = kill_in_save

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 not in (4, 7, 9):
            return
        if runner.iter + 1 == self.kill_in_save and runner.rank == 1:
            write_data = dcp.FileSystemWriter.write_data

            def write_then_die(writer: Any, *args: Any, **kwargs: Any) -> Any:
                written = write_data(writer, *args, **kwargs)
                written.wait()
                os.kill(os.getpid(), signal.SIGKILL)

            dcp.FileSystemWriter.write_data = write_then_die  # type: ignore[method-assign]
        runner.save_checkpoint(runner.checkpoint_dir / f"iter_{runner.iter + 1}.pt")


def main() -> None:
    work_dir = Path(sys.argv[1])
    for strategy in ("ddp", "fsdp"):
        Runner(**build(), **{**RUN, "strategy": strategy}, work_dir=work_dir / strategy).train()
    for strategy in ("ddp", "fsdp"):
        settings = {**RUN, "strategy": strategy}
        Runner(
            **build(), **settings, work_dir=work_dir / f"plugins_{strategy}", plugins=PLUGINS
        ).train()
    # the DDP run's file at iteration 9, resumed under FSDP to the end
    resumed = Runner(**build(), **RUN, work_dir=work_dir / "from_file")
    resumed.train(resume=work_dir / "ddp" / "checkpoints" / "iter_9.pt")
    try:  # refused before any work, on every rank
        Runner(**build(), **RUN, work_dir=work_dir / "ema", plugins={"ema": {}}).train()
    except ConfigError as exc:
        (work_dir / f"ema_rank{dist.get_rank()}.txt").write_text(str(exc))
    torch.save(model().state_dict(), work_dir / "start.pt")


if __name__ == "__main__":
    main()

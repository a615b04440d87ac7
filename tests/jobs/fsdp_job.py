"""The FSDP tests' task and jobs; run under torchrun.

``build`` is the task of the CLI tests' config (``task: fsdp_job.py:build``); ``RUN`` the
runner settings they share. ``torchrun --nproc-per-node=2 fsdp_job.py WORK_DIR`` trains the
same run under DDP, then under FSDP, in one process group (``ddp/``, ``fsdp/``), then both
again with built-in plugins, EMA included (``plugins_ddp/``, ``plugins_fsdp/``), resumes the
latter from its folder ``iter_7.pt`` (``plugins_resumed/``) and the DDP run's file checkpoint
under FSDP (``from_file/``), and runs every built-in plugin alone under FSDP
(``conformance/``, outcomes in ``conformance_rank<N>.json``). ``fsdp_job.py WORK_DIR
--resume-from FOLDER`` runs the plugins' run from FOLDER on this job's ranks, EMA alone.
Every run writes what the tests compare (weights, EMA weights, metrics, the hook points each
rank saw, the samples it trained on) to ``result_rank<N>.pt`` in its work dir.
"""

from __future__ import annotations

import json
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

from hookrun import Runner, hookimpl
from hookrun.distributed.fsdp import full_state_dict
from hookrun.testing import assert_states_equal, toy_model, toy_runner_kwargs


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


#: the built-in plugins of the ``plugins_*`` runs (the EMA's average is validated and saved)
PLUGINS = {
    "checkpoint": {"max_keep": 1, "save_best": "accuracy"},
    "timer": {"warmup": 1, "window": 3},
    "logger": {},
    "precise_bn": {"num_batches": 4},
    "ema": {"decay": 0.8, "evaluate": "both"},  # a raw pass, then one with the average
}

#: the runner settings of the ``plugins_*`` runs: every unit keeps its gathered parameters
#: after an evaluation forward, which the EMA's swap must not let outlive it
PLUGINS_RUN = {**RUN, "fsdp": {"wrap": ["Block"], "reshard_after_forward": False}}

#: the plugins of a run resumed on another number of ranks: the one whose state is resharded
EMA_ONLY = {"ema": PLUGINS["ema"]}

#: every built-in plugin, each run alone under FSDP by :func:`conformance`
BUILT_IN = (
    "logger",
    "timer",
    "checkpoint",
    "precise_bn",
    "ema",
    "early_stopping",
    "nan_guard",
    "memory",
    "profiler",
)


def build(kill_in_save: int | None = None) -> dict[str, Any]:
    """40 samples (5 batches of 4 per rank and epoch); 9 validation samples give rank 0
    two batches and rank 1 one. SGD with momentum: AdamW would magnify the rounding noise of
    a gradient that is zero (the first layer's bias, before BatchNorm)."""
    net = model()
    train = data(40, 1, shuffle=True)
    return {
        "model": net,
        "train_dataloader": train,
        "val_dataloader": data(9, 2, shuffle=False),
        "optimizer": torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": accuracy},
        "hooks": [Recorder(train.dataset.tensors[0]), SaveAt(kill_in_save)],
    }


def gathered(state: Any) -> Any:
    """A copy of ``state`` with its ``DTensor`` shards gathered whole (a collective under FSDP)."""
    if hasattr(state, "full_tensor"):
        return state.full_tensor()
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: gathered(v) for k, v in state.items()}
    return state


class Recorder:
    """The hook points this rank saw, in order, with the iteration each came at; the
    training samples it saw (dataset indices by epoch); the EMA's average after a resume."""

    def __init__(self, inputs: torch.Tensor) -> None:
        self.calls: list[str] = []
        self.index = {row.numpy().tobytes(): i for i, row in enumerate(inputs)}
        self.seen: dict[int, list[int]] = {}
        self.ema_loaded: dict[str, torch.Tensor] = {}

    def note(self, name: str, runner: Any) -> None:
        self.calls.append(f"{name}@{runner.iter}")

    @hookimpl
    def before_train_epoch(self, runner: Any) -> None:
        self.note("before_train_epoch", runner)

    @hookimpl
    def after_train_iter(self, runner: Any, batch: Any) -> None:
        self.note("after_train_iter", runner)
        rows = [self.index[row.numpy().tobytes()] for row in batch[0].cpu()]
        self.seen.setdefault(runner.epoch, []).extend(rows)

    @hookimpl
    def before_train(self, runner: Any) -> None:
        """After a resume, the average the EMA plugin built from the loaded state."""
        if runner.resumed_from is not None and "ema" in runner.plugins:
            self.ema_loaded = gathered(runner.plugins["ema"].state_dict()["model"])

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
        ema = runner.plugins.get("ema")
        result = {
            "weights": {k: v.detach().clone() for k, v in weights.items()},
            "ema": gathered(ema.state_dict()["model"]) if ema is not None else {},
            "ema_loaded": self.ema_loaded,
            "metrics": runner.last_metrics["val"],
            "calls": self.calls,
            "seen": self.seen,
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
    if sys.argv[2:3] == ["--resume-from"]:  # the plugins' run, from a folder, on these ranks
        Runner(**build(), **RUN, work_dir=work_dir, plugins=EMA_ONLY).train(resume=sys.argv[3])
        return
    for strategy in ("ddp", "fsdp"):
        Runner(**build(), **{**RUN, "strategy": strategy}, work_dir=work_dir / strategy).train()
    for strategy in ("ddp", "fsdp"):
        settings = {**PLUGINS_RUN, "strategy": strategy}
        Runner(
            **build(), **settings, work_dir=work_dir / f"plugins_{strategy}", plugins=PLUGINS
        ).train()
    # the plugins' FSDP run from its folder at iteration 7 (mid-epoch), to the end
    resumed = Runner(
        **build(), **PLUGINS_RUN, work_dir=work_dir / "plugins_resumed", plugins=PLUGINS
    )
    resumed.train(resume=work_dir / "plugins_fsdp" / "checkpoints" / "iter_7.pt")
    # the DDP run's file at iteration 9, resumed under FSDP to the end
    resumed = Runner(**build(), **RUN, work_dir=work_dir / "from_file")
    resumed.train(resume=work_dir / "ddp" / "checkpoints" / "iter_9.pt")
    outcomes = {name: conformance(name, work_dir / "conformance" / name) for name in BUILT_IN}
    outcomes["nan_guard_one_shard"] = nan_in_one_shard(work_dir / "nan_guard_one_shard")
    rank = dist.get_rank()
    (work_dir / f"conformance_rank{rank}.json").write_text(json.dumps(outcomes))
    torch.save(model().state_dict(), work_dir / "start.pt")


def conformance(name: str, work_dir: Path) -> str:
    """``hookrun.testing``'s run-time conformance checks under 2-rank FSDP: the plugin alone
    (default settings, toy task with BatchNorm) trains to the end, and its state comes back
    unchanged through a sharded checkpoint folder loaded by a new run. "ok" or the failure."""
    try:
        runner = Runner(**fsdp_toy(work_dir / "run"), plugins={name: {}})
        runner.train()
        assert list(runner.plugins) == [name], list(runner.plugins)
        # 12 samples over 2 ranks in batches of 4: 2 iterations per epoch, 2 epochs
        assert (runner.epoch, runner.iter) == (2, 4), "the run stopped early"
        plugin = runner.plugins[name]
        if not hasattr(plugin, "state_dict"):
            return "ok"
        folder = runner.save_checkpoint(work_dir / "conformance.pt")
        fresh = Runner(**fsdp_toy(work_dir / "fresh"), plugins={name: {}})
        fresh.load_checkpoint(folder, resume=True)
        saved = [gathered(plugin.state_dict())]  # rank 0's state is the one saved, as under DDP
        dist.broadcast_object_list(saved, src=0)
        assert_states_equal(gathered(fresh.plugins[name].state_dict()), saved[0], name)
        return "ok"
    except Exception as exc:  # reported per plugin, so one failure names its plugin
        return f"{type(exc).__name__}: {exc}"


def nan_in_one_shard(work_dir: Path) -> str:
    """nan_guard under FSDP with a NaN put into rank 1's shard of one gradient at iteration 1
    (rank 0's shards stay finite): every rank skips that step, and only that one."""
    try:
        runner = Runner(
            **fsdp_toy(work_dir), plugins={"nan_guard": {}}, hooks=[NanInShard(at=1, rank=1)]
        )
        runner.train()
        guard = runner.plugins["nan_guard"]
        assert (guard.skipped, guard.nonfinite) == (1, 1), (guard.skipped, guard.nonfinite)
        weights = full_state_dict(runner.model)
        assert all(v.isfinite().all() for v in weights.values()), "weights not finite"
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


class NanInShard:
    """Puts a NaN into ``rank``'s local shard of the first parameter's gradient at iteration
    ``at``, before any plugin looks at the gradients."""

    priority = 0

    def __init__(self, at: int, rank: int) -> None:
        self.at, self.rank = at, rank

    @hookimpl
    def before_optimizer_step(self, runner: Any) -> None:
        if runner.iter == self.at and runner.rank == self.rank:
            grad = next(iter(runner.unwrapped_model.parameters())).grad
            grad.to_local().view(-1)[0] = float("nan")


def fsdp_toy(work_dir: Path) -> dict[str, Any]:
    """The conformance checks' toy run (``hookrun.testing.toy_runner_kwargs``) under FSDP."""
    kwargs = toy_runner_kwargs(work_dir, model=toy_model(batch_norm=True), strategy="fsdp")
    return {**kwargs, "work_dir": work_dir}


if __name__ == "__main__":
    main()

"""What a checkpoint holds and how it is put back: the runner's side of checkpoints.

The file format and the I/O live in :mod:`hookrun.checkpoint`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookrun import checkpoint as ckpt_io
from hookrun import dist
from hookrun.errors import CheckpointError
from hookrun.loop import LoopPosition

if TYPE_CHECKING:
    from hookrun.runner import Runner


def collect(runner: Runner, save_optimizer: bool = True) -> dict[str, Any]:
    """The full state of a run (format ``hookrun/1``), every rank's RNG streams included."""
    pos = runner.position
    rng = ckpt_io.rng_state()
    ranks = dist.all_gather_object(rng) if runner.world_size > 1 else None
    state: dict[str, Any] = {
        "format": ckpt_io.FORMAT,
        "meta": {
            "hookrun_version": _version(),
            "epoch": pos.epoch + int(pos.epoch_closed(runner.by_epoch)),
            "iter": pos.iter,
            "time": time.time(),
            "world_size": runner.world_size,
        },
        "model": runner.unwrapped_model.state_dict(),
        "loop": pos.state_dict(),
        "rng": rng,
        "plugins": {name: obj.state_dict() for name, obj in runner.manager.stateful().items()},  # type: ignore[attr-defined]
    }
    if save_optimizer and runner.optimizer is not None:
        state["optimizer"] = runner.optimizer.state_dict()
    if runner.scheduler is not None:
        state["scheduler"] = runner.scheduler.state_dict()
    if runner.scaler is not None:
        state["scaler"] = runner.scaler.state_dict()
    if ranks is not None:
        state["rng_ranks"] = ranks
    return state


def restore(runner: Runner, checkpoint: dict[str, Any], resume: bool) -> None:
    """Load the weights, and with ``resume`` everything else a run needs to continue exactly."""
    runner.unwrapped_model.load_state_dict(checkpoint["model"])
    if not resume:
        return
    for name in ("optimizer", "scheduler", "scaler"):
        target = getattr(runner, name)
        if target is not None and name in checkpoint:
            target.load_state_dict(checkpoint[name])
    runner.position = LoopPosition.from_state(checkpoint["loop"])
    for name, obj in runner.manager.stateful().items():
        if name in checkpoint.get("plugins", {}):
            obj.load_state_dict(checkpoint["plugins"][name])  # type: ignore[attr-defined]
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if len(ranks) != runner.world_size:
        runner.info(f"checkpoint of {len(ranks)} process(es): rank 0's RNG streams used")
    ckpt_io.set_rng_state(ranks[runner.rank] if len(ranks) == runner.world_size else ranks[0])


def load_into(runner: Runner, path: Path, resume: bool) -> dict[str, Any]:
    """Load ``path`` and restore it into ``runner`` (weights only unless ``resume``)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = ckpt_io.load(path)
    except Exception as exc:
        raise CheckpointError(
            f"cannot load checkpoint {path}: {type(exc).__name__}: {exc}"
        ) from exc
    _restore(runner, checkpoint, resume)
    return checkpoint


def resume(runner: Runner, resume: str | Path) -> None:
    """Continue from ``resume``: a path, or "auto" for the newest checkpoint that loads."""
    if str(resume) == "auto":
        found = ckpt_io.newest_loadable(runner.checkpoint_dir, runner.info)
        if found is None:
            runner.info(f"no checkpoint in {runner.checkpoint_dir}; starting fresh")
            return
        path, checkpoint = found
        _restore(runner, checkpoint, resume=True)
    else:
        path = Path(resume)
        load_into(runner, path, resume=True)
    runner.resumed_from = path
    runner.info(f"resumed from {path} at iteration {runner.iter}")


def _restore(runner: Runner, checkpoint: dict[str, Any], resume: bool) -> None:
    restore(runner, checkpoint, resume)
    runner.hooks.after_load_checkpoint(runner=runner, checkpoint=checkpoint)


def _version() -> str:
    from hookrun import __version__

    return __version__

"""What a checkpoint holds and how it is put back: the runner's side of checkpoints.

The file format and the I/O live in :mod:`hookrun.checkpoint.files`; which checkpoint a run
continues from, and what a work dir's checkpoints say of its run, in
:mod:`hookrun.checkpoint.resume`.
Everything here works on a :class:`~hookrun.checkpoint.checkpointable.Checkpointable`, never
on the Runner itself.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any

from hookrun.checkpoint import files as ckpt_io
from hookrun.checkpoint import random_state
from hookrun.checkpoint.accumulation import partial_gradients, restore_partial_gradients
from hookrun.checkpoint.checkpointable import Checkpointable
from hookrun.checkpoint.storage import URL
from hookrun.config.schedule import continue_schedule, scheduler_entries
from hookrun.data.sharding import padding_note
from hookrun.data.streams import StatefulLoader
from hookrun.distributed import collectives
from hookrun.engine.compiled import ORIG_MOD, plain_names
from hookrun.engine.optimizer_step import SINGLE
from hookrun.engine.position import LoopPosition, Phase
from hookrun.errors import CheckpointError, CheckpointMismatchError, first_line
from hookrun.writers.lifecycle import restore_writer_states, writer_states


def collect(runner: Checkpointable, save_optimizer: bool = True) -> dict[str, Any]:
    """The full state of a run (format ``hookrun/1``), every rank's RNG streams included."""
    pos = runner.position
    if pos.stepping:
        raise CheckpointError(
            f"no checkpoint taken during iteration {pos.iter}'s optimizer step: its weights "
            "may have changed before the position counts the step, so the two would disagree"
        )
    rng = random_state.rng_state()
    ranks = collectives.all_gather_object(rng) if runner.world_size > 1 else None
    state: dict[str, Any] = {
        "format": ckpt_io.FORMAT,
        "meta": {
            "hookrun_version": _version(),
            "epoch": pos.epoch + int(pos.epoch_closed(runner.validation_schedule.by_epoch)),
            "iter": pos.iter,
            "time": time.time(),
            "world_size": runner.world_size,
            "optimizers": {name: type(opt).__name__ for name, opt in runner.optimizers.items()},
        },
        "model": plain_names(runner.unwrapped_model.state_dict()),
        "loop": pos.state_dict(),
        "rng": rng,
        "plugins": {name: obj.state_dict() for name, obj in runner.stateful_plugins().items()},
    }
    if save_optimizer and runner.optimizers:
        state["optimizers"] = (
            {SINGLE: _sharded().optimizer_state(runner)}
            if runner.strategy == "fsdp"
            else {name: opt.state_dict() for name, opt in runner.optimizers.items()}
        )
    if runner.schedulers:
        state["schedulers"] = {name: s.state_dict() for name, s in runner.schedulers.items()}
    if runner.scaler is not None:
        state["scaler"] = runner.scaler.state_dict()
    if ranks is not None:
        state["rng_ranks"] = ranks
    loader = runner.train_loader
    if isinstance(loader, StatefulLoader):  # every rank's own position in its share
        own = loader.state_dict()
        state["loader"] = collectives.all_gather_object(own) if runner.world_size > 1 else [own]
    writers = writer_states(runner.writers)  # rank 0's trackers: their run ids, for resume
    if writers:
        state["writers"] = writers
    partial = partial_gradients(runner)  # taken inside an accumulation group: its gradients
    if partial is not None:
        state["accumulation"] = partial
    return state


def restore(runner: Checkpointable, checkpoint: dict[str, Any], resume: bool) -> None:
    """Load the weights, and with ``resume`` everything else a run needs to continue exactly.

    The caller has checked the fit (:func:`hookrun.checkpoint.fit.fit_problems`). With ``resume``
    the plugins' states go first, since only their own ``load_state_dict`` can judge them: a
    plugin that refuses its state raises :class:`PluginStateError` with the runner's own
    state (weights, optimizer, position, RNG) untouched and the plugins already given their
    state given back a copy of what they held before (as far as their ``load_state_dict``
    takes it: the EMA plugin, before it has seen the model, keeps what it was last given).
    """
    # what the schedulers keep in the param groups as this run built them: loading the
    # optimizers brings the checkpoint's, which a schedule that differs must not use
    built = {name: scheduler_entries(o) for name, o in runner.optimizers.items()} if resume else {}
    if resume:
        plugins = checkpoint.get("plugins", {})
        if "sharded" in checkpoint:  # the tensors the folder holds for plugins, read in
            plugins = _sharded().plugin_states(runner, checkpoint)
        _restore_plugins(runner, plugins)
        restore_writer_states(runner.writers, checkpoint.get("writers") or {})
    sharded = runner.strategy == "fsdp"
    if "sharded" in checkpoint:  # tensors from the folder's shards, optimizer included
        _sharded().restore_tensors(runner, checkpoint, resume)
    elif sharded:  # a file's whole tensors cut into this rank's shards, optimizer included
        _sharded().restore_whole(runner, checkpoint, resume)
    else:
        load_model_state(runner, checkpoint["model"])
    if not resume:
        return
    if not (sharded or "sharded" in checkpoint):
        for name, saved_state in checkpoint.get("optimizers", {}).items():
            runner.optimizers[name].load_state_dict(saved_state)
    if runner.scaler is not None and "scaler" in checkpoint:
        runner.scaler.load_state_dict(checkpoint["scaler"])
    if isinstance(checkpoint.get("accumulation"), dict):
        restore_partial_gradients(runner, checkpoint["accumulation"])
    runner.position = LoopPosition.from_state(checkpoint["loop"])
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if len(ranks) != runner.world_size:
        runner.info(_continue_on_new_world(runner, len(ranks)) + "; rank 0's RNG streams used")
    random_state.set_rng_state(ranks[runner.rank] if len(ranks) == runner.world_size else ranks[0])
    _resume_loader(runner, checkpoint.get("loader"))
    runner.recount_position()
    for name, saved in checkpoint.get("schedulers", {}).items():
        if line := continue_schedule(runner, name, saved, built.get(name, [])):
            runner.info(line)  # a longer run is a longer schedule


def load_model_state(runner: Checkpointable, saved: dict[str, Any]) -> None:
    """Load a checkpoint's model weights; names that ``torch.compile(model)`` prefixed with
    ``_orig_mod.`` (a checkpoint written by anything) load as the plain names, with one line."""
    plain = plain_names(saved)
    if plain.keys() != saved.keys():
        runner.info(
            f"checkpoint weights carry torch.compile's {ORIG_MOD!r} in their names; "
            "loaded under the plain names"
        )
    runner.unwrapped_model.load_state_dict(plain)


def _resume_loader(runner: Checkpointable, saved: Any) -> None:
    """Give a stateful train loader its rank's saved state, to continue from on its next
    epoch (:mod:`hookrun.data.streams`). A stream without one cannot be skipped into: a
    position inside its epoch restarts that epoch, and one line says so."""
    pos, loader = runner.position, runner.train_loader
    if isinstance(loader, StatefulLoader) and isinstance(saved, list):
        if len(saved) == runner.world_size:  # else a new world's epoch: its sampling anew
            loader.pending = saved[runner.rank]
        return
    if loader is None or not loader.stream or pos.phase is not Phase.TRAIN or pos.batch == 0:
        return
    runner.info(
        f"train_dataloader: a stream without state_dict() cannot continue mid-epoch; epoch "
        f"{pos.epoch + 1} starts again from its first batch ({pos.batch} batches are trained again)"
    )
    pos.batch = 0


def _continue_on_new_world(runner: Checkpointable, saved: int) -> str:
    """Move a mid-epoch position saved by ``saved`` ranks to this run's ranks: the epoch goes
    on after the samples the saved ranks used (:mod:`hookrun.data.sharding`). Returns the line
    that says so; the global batch changes with the number of ranks."""
    pos, loader = runner.position, runner.train_loader
    size = getattr(getattr(loader, "original", None), "batch_size", None)
    line = f"checkpoint of {saved} rank(s) resumed on {runner.world_size}"
    if size:
        line += f": the global batch changes from {size * saved} to {size * runner.world_size}"
    if loader is None or pos.phase is not Phase.TRAIN or pos.batch == 0:
        return line  # nothing to train (an evaluation), or the epoch is whole
    done = loader.continue_epoch(pos.epoch, pos.batch, saved)
    if done is None:
        raise CheckpointMismatchError(
            f"cannot continue epoch {pos.epoch + 1} mid-way on {runner.world_size} rank(s) from a "
            f"checkpoint of {saved}: the train_dataloader's sampling is its own (not hookrun's "
            f"to shard); resume on {saved} rank(s) or from an epoch-end checkpoint"
        )
    used = min(pos.batch * (size or 0) * saved, len(loader.original.sampler))
    pos.batch = done
    line += f"; epoch {pos.epoch + 1} continues after {used} of its samples"
    return line + padding_note(loader, pos.epoch)


class PluginStateError(Exception):
    """A plugin's ``load_state_dict`` refused the state a checkpoint holds for it."""


def _restore_plugins(runner: Checkpointable, saved: dict[str, Any]) -> None:
    plugins = {n: p for n, p in runner.stateful_plugins().items() if n in saved}
    before = {name: copy.deepcopy(obj.state_dict()) for name, obj in plugins.items()}
    done = []
    for name, obj in plugins.items():
        done.append(name)
        try:
            obj.load_state_dict(saved[name])
        except Exception as exc:
            for undo in done:
                with contextlib.suppress(Exception):
                    plugins[undo].load_state_dict(before[undo])
            raise PluginStateError(
                f"plugins.{name}: its state does not load ({type(exc).__name__}: {first_line(exc)})"
            ) from exc


def load(path: Path | URL, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint file (its tensors memory-mapped with ``mmap``, to check a fit), an
    object of an fsspec file system, or a sharded checkpoint folder
    (:func:`hookrun.checkpoint.sharded.load`)."""
    if isinstance(path, Path) and path.is_dir():
        return _sharded().load(path)
    checkpoint = ckpt_io.load(path, mmap=mmap)
    checkpoint.pop("sharded", None)  # the folder's path, set by its loader: never a file's word
    return checkpoint


def write(runner: Checkpointable, state: dict[str, Any], path: Path | URL) -> Path | URL:
    """Write ``state`` as a file or object (this process), or under FSDP as a sharded folder
    (every rank calls this)."""
    if runner.strategy == "fsdp":
        if isinstance(path, URL):  # check_start refuses this before training
            raise CheckpointError(f"cannot write sharded checkpoint {path}: {SHARDED_LOCAL}")
        return _sharded().write(state, path)
    return ckpt_io.write(state, path)


SHARDED_LOCAL = (
    "FSDP checkpoints are folders every rank writes together; give a local or shared folder"
)


def _sharded() -> Any:
    """:mod:`hookrun.checkpoint.sharded`, imported where a sharded checkpoint is met (it
    imports DCP)."""
    from hookrun.checkpoint import sharded

    return sharded


def _version() -> str:
    from hookrun import __version__

    return __version__

"""What a checkpoint holds and how it is put back: the runner's side of checkpoints.

The file format and the I/O live in :mod:`hookrun.checkpoint`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookrun import checkpoint as ckpt_io
from hookrun import dist
from hookrun.errors import CheckpointError, CheckpointMismatchError
from hookrun.loop import LoopPosition, Phase
from hookrun.lr_schedule import continue_schedule
from hookrun.resume import disagreement, fit_problems, non_finite, summary
from hookrun.sharding import padding_note
from hookrun.writers import restore_writer_states, writer_states

if TYPE_CHECKING:
    from hookrun.runner import Runner


def collect(runner: Runner, save_optimizer: bool = True) -> dict[str, Any]:
    """The full state of a run (format ``hookrun/1``), every rank's RNG streams included."""
    pos = runner.position
    if pos.stepping:
        raise CheckpointError(
            f"no checkpoint taken during iteration {pos.iter}'s optimizer step: its weights "
            "may have changed before the position counts the step, so the two would disagree"
        )
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
        state["optimizer"] = (
            _sharded().optimizer_state(runner)
            if runner.strategy == "fsdp"
            else runner.optimizer.state_dict()
        )
    if runner.scheduler is not None:
        state["scheduler"] = runner.scheduler.state_dict()
    if runner.scaler is not None:
        state["scaler"] = runner.scaler.state_dict()
    if ranks is not None:
        state["rng_ranks"] = ranks
    writers = writer_states(runner.writers)  # rank 0's trackers: their run ids, for resume
    if writers:
        state["writers"] = writers
    return state


def restore(runner: Runner, checkpoint: dict[str, Any], resume: bool) -> None:
    """Load the weights, and with ``resume`` everything else a run needs to continue exactly.

    The caller has checked the fit (:func:`hookrun.resume.fit_problems`). With ``resume``
    the plugins' states go first, since only their own ``load_state_dict`` can judge them: a
    plugin that refuses its state raises :class:`PluginStateError` with the runner's own
    state (weights, optimizer, position, RNG) untouched and the plugins already given their
    state given back a copy of what they held before (as far as their ``load_state_dict``
    takes it: the EMA plugin, before it has seen the model, keeps what it was last given).
    """
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
        runner.unwrapped_model.load_state_dict(checkpoint["model"])
    if not resume:
        return
    by_shards = sharded or "sharded" in checkpoint
    for name in ("scaler",) if by_shards else ("optimizer", "scaler"):
        target = getattr(runner, name)
        if target is not None and name in checkpoint:
            target.load_state_dict(checkpoint[name])
    runner.position = LoopPosition.from_state(checkpoint["loop"])
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if len(ranks) != runner.world_size:
        runner.info(_continue_on_new_world(runner, len(ranks)) + "; rank 0's RNG streams used")
    ckpt_io.set_rng_state(ranks[runner.rank] if len(ranks) == runner.world_size else ranks[0])
    saved = checkpoint.get("scheduler") if runner.scheduler is not None else None
    if saved is not None and (line := continue_schedule(runner, saved)):
        runner.info(line)  # a longer run is a longer schedule


def _continue_on_new_world(runner: Runner, saved: int) -> str:
    """Move a mid-epoch position saved by ``saved`` ranks to this run's ranks: the epoch goes
    on after the samples the saved ranks used (:mod:`hookrun.sharding`). Returns the line
    that says so; the global batch changes with the number of ranks."""
    pos, loader = runner.position, runner._loaders["train"]
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


def _restore_plugins(runner: Runner, saved: dict[str, Any]) -> None:
    plugins = {n: p for n, p in runner.manager.stateful().items() if n in saved}
    before = {name: copy.deepcopy(obj.state_dict()) for name, obj in plugins.items()}  # type: ignore[attr-defined]
    done = []
    for name, obj in plugins.items():
        done.append(name)
        try:
            obj.load_state_dict(saved[name])  # type: ignore[attr-defined]
        except Exception as exc:
            for undo in done:
                with contextlib.suppress(Exception):
                    plugins[undo].load_state_dict(before[undo])  # type: ignore[attr-defined]
            raise PluginStateError(
                f"plugins.{name}: its state does not load "
                f"({type(exc).__name__}: {_first_line(exc)})"
            ) from exc


def load(path: Path) -> dict[str, Any]:
    """A checkpoint file, or a sharded checkpoint folder (:func:`hookrun.sharded.load`)."""
    if path.is_dir():
        return _sharded().load(path)
    checkpoint = ckpt_io.load(path)
    checkpoint.pop("sharded", None)  # the folder's path, set by its loader: never a file's word
    return checkpoint


def write(runner: Runner, state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` as a file (this process), or under FSDP as a sharded folder (every
    rank calls this)."""
    if runner.strategy == "fsdp":
        return _sharded().write(state, path)
    return ckpt_io.write(state, path)


def _sharded() -> Any:
    """:mod:`hookrun.sharded`, imported where a sharded checkpoint is met (it imports DCP)."""
    from hookrun import sharded

    return sharded


def check_fit(runner: Runner, path: Path, resume: bool) -> dict[str, Any]:
    """The checkpoint at ``path`` (a file or a sharded folder), loaded and found to fit
    ``runner``; changes nothing. The CLI asks before it writes anything into the work dir."""
    if not path.exists():
        raise CheckpointMismatchError(
            f"checkpoint not found: {path}", path=path, reason="file not found"
        )
    checkpoint = load(path)
    problems = fit_problems(runner, checkpoint, resume)
    if problems:
        reason = f"does not fit this run: {summary(problems)}"
        raise CheckpointMismatchError(f"checkpoint {path} {reason}", path=path, reason=reason)
    return checkpoint


def load_into(runner: Runner, path: Path, resume: bool) -> dict[str, Any]:
    """Load ``path`` and restore it into ``runner`` (weights only unless ``resume``).

    A file that is missing, cannot be loaded or does not fit the run raises
    :class:`~hookrun.errors.CheckpointMismatchError`, one line naming the file and the first
    problem of each kind, before anything of the runner is changed. Weights that are not
    finite are restored (the user named the file) with a warning line.
    """
    checkpoint = check_fit(runner, path, resume)
    bad = non_finite(checkpoint["model"])
    if bad:
        runner.info(f"warning: checkpoint {path} holds weights that are not finite ({bad})")
    try:
        _restore(runner, checkpoint, resume, path)
    except PluginStateError as exc:
        reason = str(exc)
        raise CheckpointMismatchError(
            f"cannot restore checkpoint {path}: {reason}", path=path, reason=reason
        ) from exc
    return checkpoint


def resume(runner: Runner, resume: str | Path) -> None:
    """Continue from ``resume``: a path, or "auto" (see :func:`resume_auto`). Under
    torch.distributed a checkpoint refused on any rank stops every rank, and the ranks
    check that they all continue from the same checkpoint."""
    with dist.errors_agreed():
        if str(resume) == "auto":
            resume_auto(runner)
        else:
            path = Path(resume)
            load_into(runner, path, resume=True)
            runner.resumed_from = path
            runner.info(f"resumed from {path} at iteration {runner.iter}")
    if runner.world_size > 1:
        name = runner.resumed_from.name if runner.resumed_from is not None else None
        problem = disagreement(dist.all_gather_object((name, runner.position.iter)))
        if problem:
            raise CheckpointMismatchError(problem, reason=problem)


def resume_auto(runner: Runner) -> Path | None:
    """Restore the newest checkpoint of ``runner.checkpoint_dir`` that loads and fits.

    Candidates go newest first, the file the ``latest`` pointer names (a plain name of the
    folder, or the pointer is ignored with a notice) before the others. Every file that
    cannot be loaded, does not fit the run (:func:`hookrun.resume.fit_problems`), has
    weights that are not finite, or holds a plugin state its plugin refuses, is skipped with
    one line naming it and the reason; nothing of the runner is changed by a skipped file.
    The line ``resumed from PATH at iteration N (why)`` names the file chosen.

    Weights that are not finite are never resumed from automatically: when every file that
    fits has them, :class:`~hookrun.errors.CheckpointMismatchError` says so (name one to use
    it anyway). When no file loads and fits (or there is none) the run starts fresh.
    """
    folder = runner.checkpoint_dir
    skipped: list[Path] = []
    not_finite: list[Path] = []
    for path in ckpt_io.candidates(folder, runner.info):
        try:
            checkpoint = load(path)
        except CheckpointMismatchError as exc:
            runner.info(f"skipping checkpoint {path}: cannot be loaded: {exc.reason}")
            skipped.append(path)
            continue
        problems = fit_problems(runner, checkpoint, resume=True)
        if problems:
            runner.info(f"skipping checkpoint {path}: does not fit this run: {summary(problems)}")
            skipped.append(path)
            continue
        bad = non_finite(checkpoint["model"])
        if bad:
            runner.info(f"skipping checkpoint {path}: weights are not finite ({bad})")
            skipped.append(path)
            not_finite.append(path)
            continue
        try:
            _restore(runner, checkpoint, True, path)
        except PluginStateError as exc:
            runner.info(f"skipping checkpoint {path}: {exc}")
            skipped.append(path)
            continue
        runner.resumed_from = path
        why = "newest that loads and fits"
        if ckpt_io.pointed(folder) == path.name:
            why = f"named by {folder / 'latest'}"
        if skipped:
            why += f"; skipped {len(skipped)}"
        runner.info(f"resumed from {path} at iteration {runner.iter} ({why})")
        return path
    if not_finite:
        raise CheckpointMismatchError(
            f"resume auto: every checkpoint in {folder} that fits this run has weights that "
            f"are not finite (newest: {not_finite[0].name}); name one explicitly to resume "
            "from it anyway, or start a new run",
            path=not_finite[0],
            reason="weights are not finite",
        )
    fits = " that loads and fits this run" if skipped else ""
    runner.info(f"no checkpoint in {folder}{fits}; starting fresh")
    return None


def _restore(runner: Runner, checkpoint: dict[str, Any], resume: bool, path: Path) -> None:
    """:func:`restore`, then ``after_load_checkpoint``. A failure that the fit check did
    not foresee (a module's own ``_load_from_state_dict`` refusing) is one line naming the
    file; the runner may then be partly restored, so ``auto`` stops there too."""
    try:
        restore(runner, checkpoint, resume)
    except PluginStateError:
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        raise CheckpointMismatchError(
            f"cannot restore checkpoint {path}: {reason}", path=path, reason=reason
        ) from exc
    runner.hooks.after_load_checkpoint(runner=runner, checkpoint=checkpoint)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _version() -> str:
    from hookrun import __version__

    return __version__

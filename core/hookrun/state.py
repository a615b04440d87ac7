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
from hookrun.loop import LoopPosition
from hookrun.resume import fit_problems, non_finite, summary
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
        state["optimizer"] = runner.optimizer.state_dict()
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
        _restore_plugins(runner, checkpoint.get("plugins", {}))
        restore_writer_states(runner.writers, checkpoint.get("writers") or {})
    runner.unwrapped_model.load_state_dict(checkpoint["model"])
    if not resume:
        return
    for name in ("optimizer", "scheduler", "scaler"):
        target = getattr(runner, name)
        if target is not None and name in checkpoint:
            target.load_state_dict(checkpoint[name])
    runner.position = LoopPosition.from_state(checkpoint["loop"])
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if len(ranks) != runner.world_size:
        runner.info(f"checkpoint of {len(ranks)} process(es): rank 0's RNG streams used")
    ckpt_io.set_rng_state(ranks[runner.rank] if len(ranks) == runner.world_size else ranks[0])


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


def load_into(runner: Runner, path: Path, resume: bool) -> dict[str, Any]:
    """Load ``path`` and restore it into ``runner`` (weights only unless ``resume``).

    A file that is missing, cannot be loaded or does not fit the run raises
    :class:`~hookrun.errors.CheckpointMismatchError`, one line naming the file and the first
    problem of each kind, before anything of the runner is changed. Weights that are not
    finite are restored (the user named the file) with a warning line.
    """
    if not path.is_file():
        raise CheckpointMismatchError(
            f"checkpoint not found: {path}", path=path, reason="file not found"
        )
    checkpoint = ckpt_io.load(path)
    problems = fit_problems(runner, checkpoint, resume)
    if problems:
        reason = f"does not fit this run: {summary(problems)}"
        raise CheckpointMismatchError(f"checkpoint {path} {reason}", path=path, reason=reason)
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
    """Continue from ``resume``: a path, or "auto" (see :func:`resume_auto`)."""
    if str(resume) == "auto":
        resume_auto(runner)
        return
    path = Path(resume)
    load_into(runner, path, resume=True)
    runner.resumed_from = path
    runner.info(f"resumed from {path} at iteration {runner.iter}")


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
            checkpoint = ckpt_io.load(path)
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

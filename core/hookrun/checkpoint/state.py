"""What a checkpoint holds and how it is put back: the runner's side of checkpoints.

The file format and the I/O live in :mod:`hookrun.checkpoint.files`. Which checkpoint
``resume="auto"`` continues from is decided once, by :func:`resume_candidates`; the resume,
the start's checks and the finished-run test all ask it. Everything here works on a
:class:`~hookrun.checkpoint.checkpointable.Checkpointable`, never on the Runner itself.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hookrun.checkpoint import files as ckpt_io
from hookrun.checkpoint.checkpointable import Checkpointable
from hookrun.checkpoint.fit import disagreement, fit_problems, non_finite, summary
from hookrun.checkpoint.storage import URL, location
from hookrun.config.schedule import continue_schedule, scheduler_entries
from hookrun.data.sharding import padding_note
from hookrun.data.streams import StatefulLoader
from hookrun.distributed import collectives, process_group
from hookrun.engine import workdir
from hookrun.engine.compiled import ORIG_MOD, plain_names
from hookrun.engine.optimizer_step import SINGLE
from hookrun.engine.position import LoopPosition, Phase
from hookrun.errors import CheckpointError, CheckpointMismatchError, ConfigError, HookrunError
from hookrun.writers import restore_writer_states, writer_states


def collect(runner: Checkpointable, save_optimizer: bool = True) -> dict[str, Any]:
    """The full state of a run (format ``hookrun/1``), every rank's RNG streams included."""
    pos = runner.position
    if pos.stepping:
        raise CheckpointError(
            f"no checkpoint taken during iteration {pos.iter}'s optimizer step: its weights "
            "may have changed before the position counts the step, so the two would disagree"
        )
    rng = ckpt_io.rng_state()
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
    runner.position = LoopPosition.from_state(checkpoint["loop"])
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if len(ranks) != runner.world_size:
        runner.info(_continue_on_new_world(runner, len(ranks)) + "; rank 0's RNG streams used")
    ckpt_io.set_rng_state(ranks[runner.rank] if len(ranks) == runner.world_size else ranks[0])
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
                f"plugins.{name}: its state does not load "
                f"({type(exc).__name__}: {_first_line(exc)})"
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


def check_start(runner: Checkpointable, resume: str | Path | URL | None) -> list[Path]:
    """Every check that can refuse ``runner.train(resume)``, run before anything of the run
    is written (the CLI asks before it writes ``config.yaml``, ``Runner.train`` before its
    writers open): a train loader without batches; without ``resume``, a work dir that
    holds a run (:func:`check_unused`, in the default checkpoint folder and the run's); an
    explicit checkpoint that does not fit; under ``"auto"``, checkpoints of which none can
    continue the run; a checkpoint URL whose storage does not answer, or one under FSDP.
    Returns the leftovers of a start that never completed an iteration (for
    :func:`hookrun.engine.workdir.start_over`). Changes nothing."""
    loader = runner.train_loader
    if loader is not None and loader.length == 0:
        raise ConfigError("train_dataloader: yields no batches")
    if runner.strategy == "fsdp" and isinstance(runner.checkpoint_dir, URL):
        raise ConfigError(f"plugins.checkpoint.out_dir: {runner.checkpoint_dir}: {SHARDED_LOCAL}")
    if resume is None:
        folders = [runner.work_dir / workdir.CHECKPOINTS, runner.checkpoint_dir]
        return check_unused(runner.work_dir, folders)
    if str(resume) == "auto":
        survey = _Survey()
        for _ in resume_candidates(runner, survey):
            return []
        survey.raise_when_refused()
    else:
        check_fit(runner, location(resume), resume=True, mmap=True)
    return []


def check_fit(
    runner: Checkpointable, path: Path | URL, resume: bool, mmap: bool = False
) -> dict[str, Any]:
    """The checkpoint at ``path`` (a file or a sharded folder), loaded (its tensors mapped
    with ``mmap``) and found to fit ``runner``; changes nothing."""
    if not path.exists():
        raise CheckpointMismatchError(
            f"checkpoint not found: {path}", path=path, reason="file not found"
        )
    checkpoint = load(path, mmap)
    problems = fit_problems(runner, checkpoint, resume)
    if problems:
        reason = f"does not fit this run: {summary(problems)}"
        raise CheckpointMismatchError(f"checkpoint {path} {reason}", path=path, reason=reason)
    return checkpoint


def load_into(runner: Checkpointable, path: Path | URL, resume: bool) -> dict[str, Any]:
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


def resume(runner: Checkpointable, resume: str | Path | URL) -> None:
    """Continue from ``resume``: a path, or "auto" (see :func:`resume_auto`). Under
    torch.distributed a checkpoint refused on any rank stops every rank, and the ranks
    check that they all continue from the same checkpoint."""
    with process_group.errors_agreed():
        if str(resume) == "auto":
            resume_auto(runner)
        else:
            path = location(resume)
            load_into(runner, path, resume=True)
            runner.resumed_from = path
            runner.info(f"resumed from {path} at iteration {runner.position.iter}")
    if runner.world_size > 1:
        name = runner.resumed_from.name if runner.resumed_from is not None else None
        problem = disagreement(collectives.all_gather_object((name, runner.position.iter)))
        if problem:
            raise CheckpointMismatchError(problem, reason=problem)


def resume_auto(runner: Checkpointable) -> Path | URL | None:
    """Restore the newest checkpoint of ``runner.checkpoint_dir`` that loads and fits.

    Candidates go newest first, the file the ``latest`` pointer names (a plain name of the
    folder, or the pointer is ignored with a notice) before the others. Every file that
    cannot be loaded (a FIFO or device named like a checkpoint among them), does not fit the
    run (:func:`hookrun.checkpoint.fit.fit_problems`), has weights that are not finite, or holds a
    plugin state its plugin refuses, is skipped with one line naming it and the reason;
    nothing of the runner is changed by a skipped file. The line ``resumed from PATH at
    iteration N (why)`` names the file chosen.

    Only a folder without checkpoints starts fresh. When checkpoints exist and none can
    continue the run (the model was widened, ``torch.compile`` renamed its keys),
    :class:`~hookrun.errors.CheckpointMismatchError` names the newest and why: a fresh
    start would write over them. Weights that are not finite are never resumed from
    automatically (name one to use it anyway).
    """
    folder = runner.checkpoint_dir
    survey = _Survey()
    for path, checkpoint in resume_candidates(runner, survey, runner.info):
        try:
            _restore(runner, checkpoint, True, path)
        except PluginStateError as exc:
            runner.info(f"skipping checkpoint {path}: {exc}")
            survey.refused.append((path, str(exc)))
            continue
        runner.resumed_from = path
        why = "newest that loads and fits"
        if ckpt_io.pointed(folder) == path.name:
            why = f"named by {folder / 'latest'}"
        if survey.refused:
            why += f"; skipped {len(survey.refused)}"
        runner.info(f"resumed from {path} at iteration {runner.position.iter} ({why})")
        return path
    survey.raise_when_refused()
    runner.info(f"no checkpoint in {folder}; starting fresh")
    return None


class _Survey:
    """The checkpoints :func:`resume_candidates` passed over: each with why, and those whose weights
    are not finite."""

    def __init__(self) -> None:
        self.refused: list[tuple[Path | URL, str]] = []
        self.not_finite: list[Path | URL] = []
        self.folder: Path | URL = Path()

    def raise_when_refused(self) -> None:
        """Refuse to start fresh over checkpoints that exist (none of them could continue)."""
        folder = self.folder
        if self.not_finite:
            raise CheckpointMismatchError(
                f"resume auto: every checkpoint in {folder} that fits this run has weights "
                f"that are not finite (newest: {self.not_finite[0].name}); name one explicitly "
                "to resume from it anyway, or start a new run",
                path=self.not_finite[0],
                reason="weights are not finite",
            )
        if self.refused:
            path, reason = self.refused[0]
            raise CheckpointMismatchError(
                f"resume auto: no checkpoint in {folder} can continue this run, and starting "
                f"fresh would write over them; the newest, {path.name}, {reason}",
                path=path,
                reason=reason,
            )


def resume_candidates(
    runner: Checkpointable,
    survey: _Survey | None = None,
    report: Callable[[str], None] | None = None,
) -> Iterator[tuple[Path | URL, dict[str, Any]]]:
    """What ``resume="auto"`` may continue from, in the order it tries them: the checkpoints
    of ``runner.checkpoint_dir`` that load, fit the run and hold finite weights, newest first
    (:func:`hookrun.checkpoint.files.candidates`), loaded (tensors mapped when there is no
    ``report``: a check, not a restore); every other is added to ``survey`` and given to
    ``report`` with why. The resume takes the first whose plugins accept their state."""
    folder = runner.checkpoint_dir
    survey = survey if survey is not None else _Survey()
    survey.folder = folder
    if isinstance(folder, URL):
        folder.check()  # an unreachable store is no "no checkpoint yet"
    for path in ckpt_io.candidates(folder, report):
        try:
            checkpoint = load(path, mmap=report is None)
        except CheckpointMismatchError as exc:
            reason = f"cannot be loaded: {exc.reason}"
        else:
            problems = fit_problems(runner, checkpoint, resume=True)
            bad = None if problems else non_finite(checkpoint["model"])
            if not problems and not bad:
                yield path, checkpoint
                continue
            if bad:
                survey.not_finite.append(path)
            reason = (
                f"does not fit this run: {summary(problems)}"
                if problems
                else (f"weights are not finite ({bad})")
            )
        survey.refused.append((path, reason))
        if report is not None:
            report(f"skipping checkpoint {path}: {reason}")


def _restore(
    runner: Checkpointable, checkpoint: dict[str, Any], resume: bool, path: Path | URL
) -> None:
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


# -- what a work dir's checkpoints say -------------------------------------------------------


def check_unused(work_dir: Path, folders: Iterable[Path | URL]) -> list[Path]:
    """Refuse ``work_dir`` when it holds a run that trained (its logs, or the checkpoints of
    ``folders``), so that a start without a resume never trains over one: the one rule of
    ``hookrun train`` and ``Runner.train``. A checkpoint URL that holds anything is refused
    from any work dir (a new machine's work dir is new; the store's run is not). Else the
    leftovers of a start that never completed an iteration
    (:func:`hookrun.engine.workdir.refuse_trained`). Changes nothing."""
    folders = list(folders)
    found = checkpoint_leftovers(folders)
    for folder in folders:
        if isinstance(folder, URL) and any(
            entry.suffix == ".pt" or entry.name == "latest" for entry in folder.iterdir()
        ):
            raise HookrunError(
                f"{folder} already holds checkpoints; continue that run with `--resume auto`, "
                "or give plugins.checkpoint.out_dir another URL"
            )
    return workdir.refuse_trained(work_dir, found)


def checkpoint_leftovers(folders: Iterable[Path | URL]) -> list[Path] | None:
    """The files of ``folders`` that a run which never completed an iteration leaves (the
    ``latest`` pointer and checkpoints at iteration 0: an emergency save of a first
    iteration that failed); None when a folder holds anything else, or a file that cannot
    be judged. A URL's storage is asked first whether it answers (:meth:`URL.check`); it
    leaves nothing to remove."""
    found: list[Path] = []
    for folder in dict.fromkeys(folders):
        if isinstance(folder, URL):
            folder.check()
            continue
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name == "latest" and entry.is_file():
                found.append(entry)
                continue
            if not (entry.is_file() and entry.suffix == ".pt"):
                return None
            try:
                position = LoopPosition.from_state(ckpt_io.load(entry, mmap=True)["loop"])
            except Exception:  # not a loadable hookrun/1 file, or no position in it
                return None
            if position.iter != 0:
                return None
            found.append(entry)
    return found


def mark_finished(runner: Checkpointable) -> bool:
    """After a run that completed (training to its end, validation and test included),
    record its final position in ``<work_dir>/.hookrun.finished``; True when written. A run
    that stopped early (``stop_training``) is not finished and writes nothing; a record
    that cannot be written (a full disk) only means a later ``--resume auto`` validates
    and tests again."""
    if not _finished(runner, runner.position):
        return False
    record = {"loop": runner.position.state_dict(), "max_iters": runner.max_iters}
    try:
        ckpt_io.atomic_write_text(
            json.dumps(record) + "\n", runner.work_dir / workdir.FINISHED_NAME
        )
    except Exception:
        return False
    return True


def finished_position(runner: Checkpointable) -> LoopPosition | None:
    """The final position of a run that completed, when ``resume="auto"`` would continue
    from its last checkpoint and the training loop would have nothing left to do, else None.

    The checkpoint at the end of training is collected before the final validation (and
    the test) ran, so its position alone cannot tell a completed run from one stopped
    during that validation; the record :func:`mark_finished` leaves can. It counts when it
    is finished for this run's ``max_epochs``/``max_iters`` and the checkpoint that the
    resume would choose (:func:`resume_candidates`) is at the same iteration. Nothing is
    changed.
    """
    final = workdir.read_finished(runner.work_dir)
    if final is None or not _finished(runner, final):
        return None
    for _, checkpoint in resume_candidates(runner):
        position = LoopPosition.from_state(checkpoint["loop"])
        return final if position.iter == final.iter else None  # only the validation between
    return None


def _finished(runner: Checkpointable, position: LoopPosition) -> bool:
    """The training loop's own test, asked of ``position``."""
    from hookrun.engine.train_loop import TrainLoop

    saved, runner.position = runner.position, position
    try:
        return TrainLoop(runner).finished()
    finally:
        runner.position = saved

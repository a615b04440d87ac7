"""Which checkpoint a run continues from, and what a work dir's checkpoints say of its run.

Which checkpoint ``resume="auto"`` continues from is decided once, by
:func:`resume_candidates`; the resume, the start's checks and the finished-run test all ask
it. A start without a resume is refused over a run that trained (:func:`check_unused`), and a
completed run is recorded as finished (:func:`mark_finished`). What a checkpoint holds and how
it is put back live in :mod:`hookrun.checkpoint.state`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from hookrun.checkpoint import files as ckpt_io
from hookrun.checkpoint import folder as checkpoint_folder
from hookrun.checkpoint.checkpointable import Checkpointable
from hookrun.checkpoint.fit import disagreement, fit_problems, non_finite, summary
from hookrun.checkpoint.state import SHARDED_LOCAL, PluginStateError, load, restore
from hookrun.checkpoint.storage import URL, location
from hookrun.distributed import collectives, process_group
from hookrun.engine import workdir
from hookrun.engine.position import LoopPosition
from hookrun.errors import CheckpointMismatchError, ConfigError, HookrunError, first_line


def check_start(
    runner: Checkpointable, resume: str | Path | URL | None, writes: Iterable[str] = ()
) -> list[Path]:
    """Every check that can refuse ``runner.train(resume)``, run before anything of the run
    is written (the CLI asks before it writes ``config.yaml``, ``Runner.train`` before its
    writers open): a train loader without batches; without ``resume``, a work dir that
    holds a run (:func:`check_unused`, in the default checkpoint folder and the run's); an
    explicit checkpoint that does not fit, and one from outside the work dir and its
    checkpoint folder into a work dir that holds a run (another run's: :func:`check_unused`
    too); under ``"auto"``, checkpoints of which none can continue the run; a checkpoint URL
    whose storage does not answer, or one under FSDP. A start that is not the continuation
    of the work dir's own run is refused where a file it would write (the
    :data:`~hookrun.engine.workdir.RUN_FILES`, the ``writes`` names, leftovers in the
    checkpoint folders) exists and hookrun did not write it
    (:func:`hookrun.engine.workdir.refuse_foreign`).
    Returns the leftovers of a start that never completed an iteration (for
    :func:`hookrun.engine.workdir.start_over`). Changes nothing."""
    loader = runner.train_loader
    if loader is not None and loader.length == 0:
        raise ConfigError("train_dataloader: yields no batches")
    if runner.strategy == "fsdp" and isinstance(runner.checkpoint_dir, URL):
        raise ConfigError(f"plugins.checkpoint.out_dir: {runner.checkpoint_dir}: {SHARDED_LOCAL}")
    work_dir = runner.work_dir
    folders = [work_dir / workdir.CHECKPOINTS, runner.checkpoint_dir]
    if str(resume) == "auto":
        survey = _Survey()
        for _ in resume_candidates(runner, survey):
            return []  # the work dir's own run continues
        survey.raise_when_refused()
        workdir.refuse_foreign(work_dir, workdir.run_files(work_dir, writes))  # fresh
        return []
    if resume is not None:
        path = location(resume)
        check_fit(runner, path, resume=True, mmap=True)
        if _own_checkpoint(path, work_dir, runner.checkpoint_dir):
            return []
    try:
        leftovers = check_unused(work_dir, folders)
    except HookrunError as exc:
        if resume is None:
            raise
        raise HookrunError(
            f"--resume {resume}: a checkpoint from outside work dir {work_dir} continues only "
            f"in a work dir that holds no run, so that it trains over none: {first_line(exc)}"
        ) from None
    in_folders = [p for p in leftovers if p.parent in folders]
    workdir.refuse_foreign(work_dir, [*workdir.run_files(work_dir, writes), *in_folders])
    return leftovers


def _own_checkpoint(path: Path | URL, work_dir: Path, folder: Path | URL) -> bool:
    """Whether ``path`` is the work dir's own: inside ``work_dir`` or directly in the run's
    checkpoint ``folder`` (a URL's too)."""
    if isinstance(path, URL) or isinstance(folder, URL):
        return isinstance(path, URL) and path.parent == folder
    real = path.resolve()
    return real.is_relative_to(work_dir.resolve()) or real.parent == folder.resolve()


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
        if checkpoint_folder.pointed(folder) == path.name:
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
    (:func:`hookrun.checkpoint.folder.candidates`), loaded (tensors mapped when there is no
    ``report``: a check, not a restore); every other is added to ``survey`` and given to
    ``report`` with why. The resume takes the first whose plugins accept their state."""
    folder = runner.checkpoint_dir
    survey = survey if survey is not None else _Survey()
    survey.folder = folder
    if isinstance(folder, URL):
        folder.check()  # an unreachable store is no "no checkpoint yet"
    for path in checkpoint_folder.candidates(folder, report):
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
    """:func:`~hookrun.checkpoint.state.restore`, then ``after_load_checkpoint``. A failure
    that the fit check did not foresee (a module's own ``_load_from_state_dict`` refusing) is
    one line naming the file; the runner may then be partly restored, so ``auto`` stops there
    too."""
    try:
        restore(runner, checkpoint, resume)
    except PluginStateError:
        raise
    except Exception as exc:
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        raise CheckpointMismatchError(
            f"cannot restore checkpoint {path}: {reason}", path=path, reason=reason
        ) from exc
    runner.hooks.after_load_checkpoint(runner=runner, checkpoint=checkpoint)


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

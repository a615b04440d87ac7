"""hookrun-checkpoint: periodic, best and emergency checkpoints, keep-N, preemption-safe.

The plugin decides when, where and how many; the core writes (``runner.checkpoint_state``,
``runner.write_checkpoint``), so every file is atomic and loads with ``weights_only=True``.
Which files are kept, and why, is one record (``hookrun_checkpoint.ledger.Ledger``): every
kind of save proposes the next record, and after the file is complete, in this order, the
``latest`` pointer is replaced and the files the save took their last role from are deleted:
a crash at any moment leaves ``latest`` naming a complete checkpoint. The record is stored in
every checkpoint, so it survives a resume (from a checkpoint of this folder; one from
elsewhere starts an empty record); nothing read from it is used as a path. In a work dir, a
file is deleted or written over only when hookrun's record there lists it
(``hookrun.created_by_hookrun``). Every file
operation goes through one small interface (``hookrun_checkpoint.storage.Storage``).

Best files: a new best must beat the score each existing ``best_*.pt`` file of the metric
actually holds (read from the file at the start of training), so a run resumed from an older
checkpoint never replaces a better file of an abandoned timeline; a save that fails (a hook
raising while the state is collected, or the write) leaves the record as it was; and the file
the run resumed from is never written: while it is ``best_<metric>.pt``, the run's new bests
of that metric go to ``best_<metric>.iter_<N>.pt``.

Under gradient accumulation an iteration save waits for the end of its accumulation group (a
file saved inside one would lose the gradients gathered so far), so every periodic file
resumes exactly.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from hookrun import (
    URL,
    CheckpointError,
    ConfigError,
    HookrunError,
    Plugin,
    Priority,
    RunnerProtocol,
    all_gather_object,
    barrier,
    format_number,
    hookimpl,
    location,
    resolve_rule,
)
from hookrun_checkpoint.background import BackgroundWriter, HostCopy
from hookrun_checkpoint.ledger import (
    ROTATING,
    Ledger,
    Rule,
    plain_name,
    position_name,
    read_bookkeeping,
    survey,
)
from hookrun_checkpoint.settings import CheckpointSettings
from hookrun_checkpoint.storage import FsspecStorage, LocalStorage, Storage
from hookrun_checkpoint.writing import leftover, own_file, refuse_overwrite, write_files

__all__ = ["Checkpoint", "CheckpointSettings", "HostCopy", "leftover", "own_file"]


class Checkpoint(Plugin[CheckpointSettings]):
    """Saves checkpoints by epoch or iteration, the best ones, and on exceptions and signals."""

    name = "checkpoint"
    Settings = CheckpointSettings
    checkpoint_dir_setting = "out_dir"
    priority = Priority.VERY_LOW  # saves after every other plugin has updated its state
    enabled_by_default = True

    def __init__(self, settings: CheckpointSettings | None = None) -> None:
        super().__init__(settings)
        self.ledger = Ledger()  # the files kept and why, stored in every checkpoint
        self.storage: Storage = LocalStorage(Path("checkpoints"))
        self.training = False
        self.stopped = False  # the stop signal's checkpoint is saved: no more saves this run
        self.saved: tuple[dict[str, Any], str] | None = None  # (loop, file) of the last save
        self.writer = BackgroundWriter()
        self.ignored: list[tuple[str, str]] = []  # (what, why) dropped by load_state_dict
        self.pending: list[str] = []  # files whose last role ended at the start of training
        self.undo: tuple[dict[str, Any], Any, list[str]] | None = None  # before the write

    # -- state ---------------------------------------------------------------------------

    @property
    def best(self) -> dict[str, dict[str, Any]]:
        """Each metric's best entry (score, file, rule, epoch, iter), from the record."""
        return self.ledger.best

    def state_dict(self) -> dict[str, Any]:
        return self.ledger.state_dict()

    def _set_state(self, state: dict[str, Any], saved: Any, pending: list[str]) -> None:
        """Put back bookkeeping this plugin produced itself (no checks needed)."""
        self.ledger = Ledger.from_state(state)
        self.saved, self.pending = saved, pending

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the bookkeeping a checkpoint holds, keeping only plain file names of the
        plugin's own kinds; what is dropped is named in ``before_train``."""
        self.ledger, self.ignored = read_bookkeeping(state)

    def checkpoint_dir(self, work_dir: Path) -> Path | URL | None:
        """``out_dir``: a URL as it is, a path inside ``work_dir`` when relative; None keeps
        the run's default."""
        out_dir = self.settings.out_dir
        if not out_dir:
            return None
        folder = location(out_dir)
        return folder if isinstance(folder, URL) else work_dir / folder

    # -- hooks ---------------------------------------------------------------------------

    @hookimpl
    def before_run(self, runner: RunnerProtocol) -> None:
        folder = runner.checkpoint_dir
        self.storage = FsspecStorage(folder) if isinstance(folder, URL) else LocalStorage(folder)
        if runner.mode != "train":
            return
        self.training = self.stopped = False
        self.saved = None
        if runner.is_main:
            for name in self.storage.names():
                if leftover(name):
                    self.storage.remove(name)

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        """Name what the checkpoint's bookkeeping held that is no file name, forget files
        that are gone or lie outside the folder, take each metric's best score from the best
        files themselves, and give the file this run resumed from its role in the record (the
        file an earlier run resumed from loses it). A record read from a checkpoint outside the
        folder names that checkpoint's folder's files, not this one's: the record starts
        empty (nothing here is deleted or ranked by it). Rank 0 looks at the folder; every
        rank takes its answer."""
        self.training = True
        folder = self.storage.folder
        for what, why in self.ignored:
            runner.info(f"checkpoint: ignoring {what} from the checkpoint: {why} {folder}")
        self.ignored = []
        resumed = runner.resumed_from
        if resumed is not None and not self.storage.holds(resumed) and self.ledger.roles():
            # its record names the files of the folder it came from, not of this one
            runner.info(
                f"checkpoint: resumed from outside {folder}: the files the checkpoint's "
                "record keeps are its own folder's, so the record here starts empty"
            )
            self.ledger = Ledger()
        view = None
        if runner.is_main:
            view = survey(self.storage, self.ledger, self.settings.save_best, self.settings.rule)
        if runner.world_size > 1:
            view = all_gather_object(view)[0]
        assert view is not None
        self.ledger, notices = view
        for line in notices:
            runner.info(line)
        earlier = self.ledger.resumed
        self.ledger.resumed = None
        if resumed is not None and self.storage.holds(resumed) and own_file(resumed.name):
            self.ledger.resumed = resumed.name
        self.pending = [earlier] if earlier is not None else []
        if self.settings.save_best and runner.val_dataloader is None:
            runner.info("checkpoint: save_best is set but there is no val_dataloader")

    def unused_hooks(self, runner: RunnerProtocol) -> set[str]:
        """Saving by epoch needs no per-iteration hook."""
        return {"after_train_iter"} if self.settings.by_epoch else set()

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        s = self.settings
        if self._due(runner) or (s.save_last and runner.is_last_iter()):
            self._save(runner)

    def _due(self, runner: RunnerProtocol) -> bool:
        """Whether an iteration save is due now: every ``interval`` iterations, but under
        gradient accumulation only at the end of a group (every ``grad_accum``-th batch of an
        epoch, and its last), for a save that fell due anywhere in that group."""
        interval, accum = self.settings.interval, runner.grad_accum
        if accum == 1:
            return runner.every_n_iters(interval)
        done = runner.iter + 1
        before = runner.inner_iter % accum  # iterations of this group before this one
        if done // interval == (done - before - 1) // interval:
            return False  # no multiple of interval in this group so far
        return runner.position.closes_group

    @hookimpl
    def after_train_epoch(self, runner: RunnerProtocol) -> None:
        s = self.settings
        if self.stopped or not s.by_epoch:
            return
        if runner.every_n_epochs(s.interval) or (s.save_last and runner.is_last_epoch()):
            self._save(runner)

    @hookimpl
    def after_val_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        """Save each metric that beats its best so far to its best file: ``best_<metric>.pt``,
        or ``best_<metric>.iter_<N>.pt`` while the former is the file this run resumed from;
        a best file of this metric that the new one supersedes is deleted after it, never
        the resumed-from file. With ``save_top_k``, a score among the k best is also saved to
        its top file, and the top file it pushes out is deleted (never the resumed-from file).
        """
        if not self.training or self.stopped or not self.settings.save_best:
            return
        record = self.ledger.copy()
        tops: list[str] = []
        bests: dict[str, dict[str, Any]] = {}
        for metric, rule in self._best_metrics(metrics).items():
            value = float(metrics[metric])
            if math.isnan(value):
                continue
            entry = {"score": value, "rule": rule, "epoch": runner.epoch, "iter": runner.iter}
            stem = re.sub(r"[^A-Za-z0-9_.-]", "_", metric)
            k, name = self.settings.save_top_k, f"top_{stem}_{value:.6g}_iter_{runner.iter}.pt"
            if k is not None and record.add_top(metric, {**entry, "file": name}, k):
                tops.append(name)
            name = f"best_{stem}.pt"
            if name == record.resumed:
                name = f"best_{stem}.iter_{runner.iter}.pt"
            if record.add_best(metric, {**entry, "file": name}):
                bests[metric] = record.best[metric]
        names = tops + [entry["file"] for entry in bests.values()]
        if names:
            scores = ", ".join(f"{m} {format_number(e['score'])}" for m, e in bests.items())
            self._save(runner, names, record, note=f" (new best {scores})" if scores else "")

    @hookimpl
    def save_on_stop(self, runner: RunnerProtocol) -> Path | URL:
        """The stop signal's checkpoint, named by its position like a periodic one; when the
        last file saved holds this very position (a signal during the validation that
        followed it), that file is the answer and nothing is written again."""
        self.stopped = True
        if self.saved is not None and self.saved[0] == runner.position.state_dict():
            return self.storage.path(self.saved[1])
        self._save(runner, background=False)
        assert self.ledger.latest is not None
        return self.storage.path(self.ledger.latest)

    @hookimpl
    def after_train(self, runner: RunnerProtocol) -> None:
        """When a hook ended training with ``stop_training`` (not a stop signal: its save is
        done), save the final state, unless the last file saved is a periodic one of it."""
        training, self.training = self.training, False
        if not (training and runner.stop_training and self.settings.save_last) or self.stopped:
            return
        saved = self.saved
        if saved is None or saved[0] != runner.position.state_dict():
            self._save(runner)
        elif not plain_name(saved[1], ROTATING):
            self._save(runner)  # the final state under a periodic name, beside its best file

    @hookimpl
    def after_run(self, runner: RunnerProtocol) -> None:
        """Wait for the write in flight."""
        if runner.mode != "train":
            return
        try:
            self._wait()
        finally:
            self.writer.release()

    @hookimpl
    def on_exception(self, runner: RunnerProtocol, exception: BaseException) -> None:
        """Save ``emergency_iter_<N>.pt`` unless the exception is a failed checkpoint write
        or a mistake of the user's (a ``HookrunError``: a batch that fits no step
        convention, at any iteration): bad input writes nothing (DESIGN §12)."""
        try:
            self._wait()
        except CheckpointError as exc:
            runner.info(str(exc))
        finally:
            self.writer.release()
        training, self.training = self.training, False
        if (
            not training
            or self.stopped
            or not self.settings.save_on_exception
            or isinstance(exception, (CheckpointError, HookrunError))
            or runner.world_size > 1  # the other ranks are not here to gather their state
        ):
            return
        self._save(runner, emergency=True, background=False)

    # -- saving --------------------------------------------------------------------------

    def _save(
        self,
        runner: RunnerProtocol,
        names: list[str] | None = None,
        record: Ledger | None = None,
        emergency: bool = False,
        background: bool = True,
        note: str = "",
    ) -> None:
        """Write one state to ``names`` with ``record`` as the next record (default: a
        periodic name from its position, added to the record), then point ``latest`` at it
        and delete the files whose last role this save took away; its one console line
        names the files and ends with ``note`` (a new best). The file holds the record
        as it is once the file exists; until then any failure (a ``before_save_checkpoint``
        hook, the host copy, the write) puts the record back as it was, so no later
        checkpoint claims a file that was never written. A background write keeps the old
        record in ``undo`` until ``_wait``."""
        self._wait()
        previous = (self.state_dict(), self.saved, self.pending)
        sharded = runner.sharded_checkpoints  # FSDP: every rank writes its shards, in step
        background = background and self.settings.async_save and not sharded
        try:
            self._save_now(runner, names, record, emergency, background, note)
        except BaseException:
            self._set_state(*previous)
            raise
        if background and runner.is_main:
            self.undo = previous
        if not background:
            barrier()

    def _save_now(
        self,
        runner: RunnerProtocol,
        names: list[str] | None,
        record: Ledger | None,
        emergency: bool,
        background: bool,
        note: str,
    ) -> None:
        """The body of :meth:`_save`: the next record, the state, the write. Its line names
        the files relative to the folder (the run's summary names the folder)."""
        before = [*self.ledger.roles(), *self.pending]
        ledger = self.ledger = record or self.ledger
        state = runner.checkpoint_state(self.settings.save_optimizer)
        if names is None:
            name = position_name(state, self.settings.by_epoch and not emergency)
            names = ["emergency_" + name] if emergency else [name]
            ledger.add_periodic(names[0], self.settings.max_keep)
        ledger.latest = names[-1]
        delete, self.pending = ledger.released(before), []
        self.saved = (dict(state["loop"]), names[-1])
        state.setdefault("plugins", {})[self.name] = self.state_dict()
        if not (runner.is_main or runner.sharded_checkpoints):
            return
        storage, paths = self.storage, [self.storage.path(name) for name in names]
        if runner.is_main:
            refuse_overwrite(storage, names)
        if background:
            job = self.writer.host.copy(state)
            write = runner.write_checkpoint
            self.writer.submit(lambda: write_files(storage, write, job, names, delete), paths[0])
            runner.info(f"checkpoint: writing {', '.join(names)} in the background{note}")
        else:
            write_files(storage, runner.write_checkpoint, state, names, delete, runner.is_main)
            runner.info(f"checkpoint: saved {', '.join(names)}{note}")

    def _wait(self) -> None:
        """Wait for the write in flight; when it failed, put the bookkeeping back as it was
        before that save (its file does not exist) and raise the error."""
        undo, self.undo = self.undo, None
        try:
            self.writer.wait()
        except BaseException:
            if undo is not None:
                self._set_state(*undo)
            raise

    def _best_metrics(self, metrics: dict[str, float]) -> dict[str, Rule]:
        """The ``save_best`` names, checked against what validation reported, and their
        rules."""
        wanted = self.settings.save_best
        if wanted == "auto":
            names = list(metrics)[:1]
        else:
            names = [wanted] if isinstance(wanted, str) else list(wanted or ())
        rules: dict[str, Rule] = {}
        for name in names:
            if name not in metrics:
                raise ConfigError(
                    f"plugins.checkpoint.save_best: validation reports no metric {name!r} "
                    f"(it reports: {', '.join(metrics) or 'nothing'})"
                )
            try:
                rules[name] = resolve_rule(name, self.settings.rule)
            except ValueError as exc:
                raise ConfigError(f"plugins.checkpoint.rule: {exc}") from None
        return rules

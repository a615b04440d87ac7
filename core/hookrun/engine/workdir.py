"""What a work dir already holds, and where a run's checkpoints are.

- :func:`refuse_trained`: a work dir holding a run that trained is refused without a resume;
  one whose run never completed an iteration does not block a new run, which removes the
  leftovers it can prove hookrun wrote (:func:`start_over`, from the record
  :mod:`hookrun.engine.workdir_hold` keeps). The lock that keeps one run at a time in a
  work dir is that module's too; how files there are opened, :mod:`hookrun.engine.workdir_files`'.
- :func:`refuse_foreign`: a run never writes over a file of the work dir that hookrun did not
  write (the user's own ``config.yaml`` in ``work_dir: .``); what hookrun wrote there is what
  its record lists.
- :func:`checkpoint_dirs`: where a run's checkpoints are (``<work_dir>/checkpoints`` unless
  a plugin declares another folder); the Runner keeps the answer as ``runner.checkpoint_dir``.
  Checkpoints may go to an object store (:class:`hookrun.checkpoint.storage.URL`); the work
  dir itself stays local.
- :func:`read_finished` / :data:`FINISHED_NAME`: a completed ``hookrun train`` records its
  final position (:func:`hookrun.checkpoint.resume.mark_finished`), so that ``--resume auto``
  can do nothing (:func:`hookrun.checkpoint.resume.finished_position`).

The checkpoint files themselves are judged on the checkpoint side
(:mod:`hookrun.checkpoint.resume`), which uses this module, never the other way round: this
module takes only the checkpoint locations from there (:mod:`hookrun.checkpoint.storage`).
"""

from __future__ import annotations

import io
import json
import os
import stat as stat_mode
import struct
from collections.abc import Iterable
from pathlib import Path

from hookrun.checkpoint.storage import URL, location
from hookrun.engine.position import LoopPosition
from hookrun.engine.workdir_files import file_kind, open_regular
from hookrun.engine.workdir_hold import MANIFEST_NAME, recorded
from hookrun.errors import HookrunError

FINISHED_NAME = ".hookrun.finished"  # the final position of a run that completed
CHECKPOINTS = "checkpoints"
"""The run's checkpoint folder in its work dir, unless a plugin declares another."""
CONFIG_NAME = "config.yaml"  # the resolved config `hookrun train` saves
RUN_FILES = ("log.jsonl", FINISHED_NAME)
"""Files a run creates under fixed names in its work dir (``hookrun train`` adds
:data:`CONFIG_NAME`); the lock and the record are hookrun's own names."""


def refuse_trained(work_dir: Path, in_checkpoints: list[Path] | None) -> list[Path]:
    """Refuse ``work_dir`` when it holds a run that trained; else the leftovers of a start
    that never completed an iteration (:func:`failed_start_leftovers`), for
    :func:`start_over`. ``in_checkpoints``: what the run's checkpoint folders hold, as
    :func:`hookrun.checkpoint.resume.checkpoint_leftovers` judges it (the checkpoint side reads
    checkpoints; :func:`hookrun.checkpoint.resume.check_unused` asks both).
    Files hookrun does not know
    do not count. Changes nothing."""
    if work_dir.exists() and not work_dir.is_dir():
        raise HookrunError(f"work dir {work_dir} exists and is not a folder")
    if not work_dir.is_dir():
        return []
    leftovers = failed_start_leftovers(work_dir, in_checkpoints)
    if leftovers is None:
        raise HookrunError(
            f"work dir {work_dir} already holds a run; continue it with `--resume auto`, "
            "or start a new one with another `--work-dir` (or delete the folder)"
        )
    return leftovers


def failed_start_leftovers(work_dir: Path, in_checkpoints: list[Path] | None) -> list[Path] | None:
    """The files that a run which never completed an iteration left in ``work_dir``; None
    when the work dir holds a run that trained, or anything that cannot be judged.

    A run trained when its log (``log.jsonl``, or a ``*.jsonl`` the manifest lists) holds a
    record with a ``step`` (scalars), an event file (``*/events.out.tfevents.*``) holds
    anything but text (the config), or its checkpoint folders did (``in_checkpoints`` is
    None; else their files). Files that cannot be judged count as training. Other files
    (a user's own ``train.jsonl``), ``config.yaml`` (rewritten by the new run) and anything
    outside ``work_dir`` are not leftovers.
    """
    own = recorded(work_dir)
    logs = {work_dir / "log.jsonl"} | {p for p in own if p.suffix == ".jsonl"}
    found: list[Path] = []
    for log in sorted(p for p in logs if os.path.lexists(p)):
        if _log_trained(log):
            return None
        found.append(log)
    for events in sorted(work_dir.glob("*/events.out.tfevents.*")):
        if _events_trained(events):
            return None
        found.append(events)
    if in_checkpoints is None:
        return None
    found += in_checkpoints  # a checkpoint folder elsewhere is judged too
    return [path for path in found if path.is_relative_to(work_dir)]  # judged, not removed


def start_over(work_dir: Path, leftovers: list[Path]) -> str | None:
    """Remove those of ``leftovers`` (see :func:`refuse_trained`) that the work dir's manifest
    proves hookrun created (:func:`~hookrun.engine.workdir_hold.record_created`): a file is
    never removed by its name alone. The line that says what was removed and what was left;
    None when there were no leftovers."""
    if not leftovers:
        return None
    own = recorded(work_dir)
    removed, left = [], []
    for path in leftovers:
        if path in own and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
        else:
            left.append(path)
    line = f"work dir {work_dir} holds a run that never completed an iteration; starting over in it"
    if removed:
        line += f" (removed {_names(work_dir, removed)})"
    if left:
        line += f" (left {_names(work_dir, left)}: not recorded as written by hookrun)"
    return line


def refuse_foreign(work_dir: Path, paths: Iterable[Path]) -> None:
    """Refuse the start when one of ``paths`` (files the run is about to create or write over
    in ``work_dir``) exists and hookrun's record of the work dir does not list it: a file
    hookrun did not write is never written over (``work_dir: .`` in a folder holding your
    own ``config.yaml``). A link or other non-file at such a name counts as such a file.
    Changes nothing."""
    own = recorded(work_dir)
    for path in paths:
        if os.path.lexists(path) and path not in own:
            mode = path.lstat().st_mode
            kind = (
                "a symbolic link"
                if stat_mode.S_ISLNK(mode)
                else None
                if stat_mode.S_ISREG(mode)
                else file_kind(mode)
            )
            raise HookrunError(
                f"{path} exists{f' ({kind})' if kind else ''} and is not a file hookrun wrote "
                f"({MANIFEST_NAME} does not list it); this run would write over it: move it "
                "away, or use another --work-dir"
            )


def run_files(work_dir: Path, extra: Iterable[str] = ()) -> list[Path]:
    """The paths of :data:`RUN_FILES` and ``extra`` names in ``work_dir``."""
    return [work_dir / name for name in (*RUN_FILES, *extra)]


def _names(work_dir: Path, paths: list[Path]) -> str:
    names = [str(p.relative_to(work_dir)) for p in paths]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _log_trained(path: Path) -> bool:
    try:
        with open_regular(path) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or "step" in record:
                    return True
    except (OSError, ValueError):
        return True
    return False


def _events_trained(path: Path) -> bool:
    """Whether a TensorBoard event file (TFRecords of ``Event``) holds more than the
    config's text; a file that does not parse counts as trained."""
    try:
        from tensorboardX.proto.event_pb2 import Event

        with open_regular(path) as f:
            while header := f.read(12):
                if len(header) < 12:
                    return True
                (size,) = struct.unpack("<Q", header[:8])
                data = f.read(size)
                if len(data) < size or len(f.read(4)) < 4:
                    return True
                event = Event.FromString(data)
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name != "text":
                        return True
    except Exception:  # OSError, a protobuf DecodeError, no tensorboardX
        return True
    return False


def read_finished(work_dir: Path) -> LoopPosition | None:
    """The final position a completed run recorded in ``<work_dir>/.hookrun.finished``; None
    when there is none or it cannot be read."""
    try:
        with open_regular(Path(work_dir) / FINISHED_NAME) as f:
            record = json.loads(f.read(1 << 20))
        return LoopPosition.from_state(record["loop"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def clear_finished(work_dir: str | Path) -> None:
    """Forget that the run finished: it is about to train again."""
    (Path(work_dir) / FINISHED_NAME).unlink(missing_ok=True)


# -- where checkpoints are -------------------------------------------------------------------


def checkpoint_dirs(work_dir: Path, plugins: Iterable[object]) -> list[Path | URL]:
    """The folders a run's checkpoints may be in, its own last: ``<work_dir>/checkpoints``,
    then the folder the first plugin that declares one names (:meth:`hookrun.Plugin.
    checkpoint_dir`): a path, or a :class:`URL` of an object store. A new run judges both:
    an earlier run may have used the default."""
    folders: list[Path | URL] = [work_dir / CHECKPOINTS]
    declared = declared_checkpoint_dir(work_dir, plugins)
    if declared is not None:
        folders.append(declared[1])
    return list(dict.fromkeys(folders))


def declared_checkpoint_dir(
    work_dir: Path, plugins: Iterable[object]
) -> tuple[object, Path | URL] | None:
    """The first plugin that declares a checkpoint folder (:meth:`hookrun.Plugin.
    checkpoint_dir`) and that folder, or None when none does."""
    for plugin in plugins:
        declare = getattr(plugin, "checkpoint_dir", None)
        declared = declare(work_dir) if callable(declare) else None
        if declared is not None:
            return plugin, location(declared)
    return None

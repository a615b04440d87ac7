"""One run at a time per work dir, and what a work dir already holds.

- :func:`hold`: an exclusive ``fcntl.flock`` on ``<work_dir>/.hookrun.lock`` for as long as a
  run trains (rank 0 only), with the holder's pid and host written into the file. The lock
  belongs to the process: it goes when the process ends, however it ends, so a file left
  by a killed run never blocks. Re-entrant within a process (the CLI takes it, then
  ``Runner.train`` takes it again); forked children (DataLoader workers) drop their copy, so
  a worker that outlives a killed parent does not keep the work dir locked.
- :func:`failed_start_leftovers`: the files a run that never completed an iteration left
  (the resolved config, a log without a training step, event files without scalars, a
  checkpoint at iteration 0): such a work dir does not block a new run.
- :func:`mark_finished` / :func:`finished_position`: a completed ``hookrun train`` records
  its final position; ``--resume auto`` then finds that the checkpoint it would continue
  from is the run's end, and does nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookrun.errors import HookrunError
from hookrun.loop import LoopPosition

if TYPE_CHECKING:
    from hookrun.runner import Runner

LOCK_NAME = ".hookrun.lock"
FINISHED_NAME = ".hookrun.finished"  # the final position of a run that completed
# file systems mounted without lock support (Lustre `noflock`, some NFS set-ups)
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


class WorkDirBusyError(HookrunError):
    """Another process holds the work dir's lock (a user mistake: exit 2 from the CLI)."""


# -- the lock --------------------------------------------------------------------------------

_held: dict[str, list[int]] = {}  # lock file's real path -> [fd (-1: no lock support), depth]
_guard = threading.Lock()


def _drop_in_child() -> None:
    """A forked child holds no work dir: close its copies of the lock files (the parent's
    lock stays: it is held by the open file, which the parent still has open)."""
    global _guard
    for fd, _ in _held.values():
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    _held.clear()
    _guard = threading.Lock()


os.register_at_fork(after_in_child=_drop_in_child)


def _stderr(message: str) -> None:
    print(f"[hookrun] {message}", file=sys.stderr)


@contextlib.contextmanager
def hold(
    work_dir: str | Path,
    enabled: bool = True,
    hint: str = "use another --work-dir",
    notice: Callable[[str], None] = _stderr,
) -> Iterator[None]:
    """Hold ``work_dir``'s lock for the block (creating the folder); a no-op unless
    ``enabled``. Raises :class:`WorkDirBusyError` naming the holder's pid and host, without
    changing anything in the work dir, when another process holds it. ``notice`` says once
    when the file system cannot lock (the run then goes on unguarded)."""
    if not enabled:
        yield
        return
    key = _acquire(Path(work_dir), hint, notice)
    try:
        yield
    finally:
        _release(key)


def _acquire(work_dir: Path, hint: str, notice: Callable[[str], None]) -> str:
    if work_dir.exists() and not work_dir.is_dir():
        raise HookrunError(f"work dir {work_dir} exists and is not a folder")
    path = work_dir / LOCK_NAME
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(path)
        with _guard:
            if key in _held:
                _held[key][1] += 1
                return key
            fd, writable = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise WorkDirBusyError(
                    f"work dir {work_dir} is in use by another hookrun run ({holder(path)}); "
                    f"wait for it or {hint}"
                ) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in _NO_LOCKS:
                    raise
                notice(
                    f"work dir {work_dir}: the file system cannot lock files; nothing keeps "
                    "a second run from using this work dir at the same time"
                )
                _held[key] = [-1, 1]
                return key
            if writable:
                _stamp(fd)
            _held[key] = [fd, 1]
            return key
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise HookrunError(f"work dir {work_dir}: cannot create {path.name} ({reason})") from exc


def _open(path: Path) -> tuple[int, bool]:
    """The lock file opened without truncating it (a refused run changes nothing)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666), True
    except PermissionError:  # another user's file: flock works on a read-only descriptor
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False


def _stamp(fd: int) -> None:
    """Write who holds the lock; a failure to write (a full disk) leaves the lock held."""
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text + "\n").encode(), 0)


def _release(key: str) -> None:
    with _guard:
        entry = _held.get(key)
        if entry is None:  # dropped by a fork
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        if entry[0] >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(entry[0], 0)  # no pid of a run that is over
            os.close(entry[0])  # releases the lock


def holder(path: Path) -> str:
    """``pid 1234 on host h`` from a lock file; the holder writes it right after locking,
    so an empty file is read again for a moment."""
    deadline = time.monotonic() + 1.0
    while True:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(path.read_text(encoding="utf-8"))
            return f"pid {int(data['pid'])} on host {data['host']}"
        if time.monotonic() > deadline:
            return "pid unknown"
        time.sleep(0.05)


# -- what a work dir holds -------------------------------------------------------------------


def failed_start_leftovers(work_dir: Path, checkpoint_dirs: Iterable[Path]) -> list[Path] | None:
    """The files that a run which never completed an iteration left in ``work_dir``, to be
    removed before a new run starts over there; None when the work dir holds a run that
    trained, or anything that cannot be judged.

    A run trained when a log (``*.jsonl``) holds a record with a ``step`` (scalars), an
    event file (``*/events.out.tfevents.*``) holds anything but text (the config), or a
    checkpoint folder holds a file other than ``latest`` and checkpoints at iteration 0 (an
    emergency save of a first iteration that failed). Files that cannot be judged count as
    training.
    ``config.yaml`` (rewritten by the new run), files hookrun does not know and anything
    outside ``work_dir`` are left where they are.
    """
    found: list[Path] = []
    for log in sorted(work_dir.glob("*.jsonl")):
        if _log_trained(log):
            return None
        found.append(log)
    for events in sorted(work_dir.glob("*/events.out.tfevents.*")):
        if _events_trained(events):
            return None
        found.append(events)
    for folder in dict.fromkeys(checkpoint_dirs):  # an out_dir elsewhere is judged too
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name == "latest" and entry.is_file():
                found.append(entry)
                continue
            if not (entry.is_file() and entry.suffix == ".pt"):
                return None
            checkpoint = peek(entry)
            if checkpoint is None or _loop_iter(checkpoint) != 0:
                return None
            found.append(entry)
    return [path for path in found if path.is_relative_to(work_dir)]  # judged, not removed


def start_over(work_dir: Path, leftovers: list[Path]) -> str:
    """Remove ``leftovers`` (see :func:`failed_start_leftovers`); the line that says so."""
    for path in leftovers:
        path.unlink(missing_ok=True)
    names = [str(p.relative_to(work_dir)) for p in leftovers]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    removed = f" (removed {shown})" if names else ""
    return (
        f"work dir {work_dir} holds a run that never completed an iteration; "
        f"starting over in it{removed}"
    )


def _log_trained(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
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

        with path.open("rb") as f:
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


def peek(path: Path) -> dict[str, Any] | None:
    """A checkpoint loaded lazily (tensors memory-mapped) to read its position and check
    its fit; None when it is not a loadable ``hookrun/1`` file (the resume names why)."""
    import torch

    from hookrun import checkpoint as ckpt_io

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a zip file (mmap needs one): the ordinary load judges it
        try:
            checkpoint = ckpt_io.load(path)
        except Exception:
            return None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != ckpt_io.FORMAT:
        return None
    return checkpoint


def _loop_iter(checkpoint: dict[str, Any]) -> int | None:
    try:
        return LoopPosition.from_state(checkpoint["loop"]).iter
    except Exception:
        return None


# -- a finished run --------------------------------------------------------------------------


def checkpoint_dir(runner: Runner) -> Path:
    """Where ``resume="auto"`` will look once the run starts: the checkpoint plugin's
    ``out_dir`` (which its ``before_run`` makes ``runner.checkpoint_dir``) when it has one."""
    plugin = runner.plugins.get("checkpoint")
    out_dir = getattr(getattr(plugin, "settings", None), "out_dir", None)
    if not out_dir:
        return Path(runner.checkpoint_dir)
    path = Path(out_dir)
    return path if path.is_absolute() else runner.work_dir / path


def mark_finished(runner: Runner) -> bool:
    """After a run that completed (training to its end, validation and test included),
    record its final position in ``<work_dir>/.hookrun.finished``; True when written. A run
    that stopped early (``stop_training``) is not finished and writes nothing; a record
    that cannot be written (a full disk) only means a later ``--resume auto`` validates
    and tests again."""
    if not _finished(runner, runner.position):
        return False
    from hookrun.checkpoint import atomic_write_text

    record = {"loop": runner.position.state_dict(), "max_iters": runner.max_iters}
    try:
        atomic_write_text(json.dumps(record) + "\n", Path(runner.work_dir) / FINISHED_NAME)
    except Exception:
        return False
    return True


def clear_finished(work_dir: str | Path) -> None:
    """Forget that the run finished: it is about to train again."""
    (Path(work_dir) / FINISHED_NAME).unlink(missing_ok=True)


def finished_position(runner: Runner) -> LoopPosition | None:
    """The final position of a run that completed, when ``resume="auto"`` would continue
    from its last checkpoint and the training loop would have nothing left to do, else None.

    The checkpoint at the end of training is collected before the final validation (and
    the test) ran, so its position alone cannot tell a completed run from one stopped
    during that validation; the record :func:`mark_finished` leaves can. It counts when it
    is finished for this run's ``max_epochs``/``max_iters`` and the checkpoint that the
    resume would choose (candidates newest first; files that do not load, do not fit the
    run or hold weights that are not finite passed over silently, as the resume names
    them) is at the same iteration. Nothing is changed.
    """
    from hookrun import checkpoint as ckpt_io
    from hookrun.resume import fit_problems, non_finite

    try:
        record = json.loads((Path(runner.work_dir) / FINISHED_NAME).read_text(encoding="utf-8"))
        final = LoopPosition.from_state(record["loop"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not _finished(runner, final):
        return None
    for path in ckpt_io.candidates(checkpoint_dir(runner)):
        checkpoint = peek(path)
        if checkpoint is None:
            continue
        try:
            position = LoopPosition.from_state(checkpoint["loop"])
            unusable = bool(fit_problems(runner, checkpoint, resume=True)) or bool(
                non_finite(checkpoint["model"])
            )
        except Exception:
            continue
        if not unusable:  # the same iteration: only the final validation lay between
            return final if position.iter == final.iter else None
    return None


def _finished(runner: Runner, position: LoopPosition) -> bool:
    """The training loop's own test, asked of ``position``."""
    from hookrun.loops import TrainLoop

    saved, runner.position = runner.position, position
    try:
        return TrainLoop(runner).finished()
    finally:
        runner.position = saved

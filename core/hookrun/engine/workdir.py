"""One run at a time per work dir, and what a work dir already holds.

- :func:`hold`: an exclusive ``fcntl.flock`` on ``<work_dir>/.hookrun.lock`` for as long as a
  run trains (rank 0 only), with the holder's pid and host written into the file. The lock
  belongs to the process: it goes when the process ends, however it ends, so a file left
  by a killed run never blocks. Re-entrant within a thread (the CLI takes it, then
  ``Runner.train`` takes it again); another thread of the same process is refused as another
  process is; forked children (DataLoader workers) drop their copy, so a worker that
  outlives a killed parent does not keep the work dir locked.
- :func:`open_for_writing`: every file hookrun writes in place in a work dir is opened
  through it: never through a symbolic link, never a FIFO, device or hard-linked file.
- :func:`record_created`: every file hookrun creates in a work dir it holds is listed in
  ``<work_dir>/.hookrun.files``; hookrun removes only files listed there.
- :func:`refuse_trained`: a work dir holding a run that trained is refused without a resume;
  one whose run never completed an iteration does not block a new run, which removes the
  leftovers it can prove hookrun wrote (:func:`start_over`).
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

import contextlib
import errno
import fcntl
import io
import json
import os
import socket
import stat as stat_mode
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO

from hookrun.checkpoint.storage import URL, location
from hookrun.engine.position import LoopPosition
from hookrun.errors import HookrunError

LOCK_NAME = ".hookrun.lock"
FINISHED_NAME = ".hookrun.finished"  # the final position of a run that completed
MANIFEST_NAME = ".hookrun.files"  # the files hookrun created here, one JSON string a line
CHECKPOINTS = "checkpoints"
"""The run's checkpoint folder in its work dir, unless a plugin declares another."""
# file systems mounted without lock support (Lustre `noflock`, some NFS set-ups)
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


class WorkDirBusyError(HookrunError):
    """Another process holds the work dir's lock (a user mistake: exit 2 from the CLI)."""


# -- the lock --------------------------------------------------------------------------------


@dataclass
class _Hold:
    """A lock this process holds: its descriptor (-1: the file system cannot lock), how many
    blocks hold it, the thread that took it, and the work dir (absolute)."""

    fd: int
    depth: int
    thread: int
    work_dir: str


_held: dict[str, _Hold] = {}  # lock file's real path -> the hold
_guard = threading.Lock()
_manifest_guard = threading.Lock()


def _drop_in_child() -> None:
    """A forked child holds no work dir: close its copies of the lock files (the parent's
    lock stays: it is held by the open file, which the parent still has open)."""
    global _guard, _manifest_guard
    for entry in _held.values():
        if entry.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(entry.fd)
    _held.clear()
    _guard = threading.Lock()
    _manifest_guard = threading.Lock()


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
    ``enabled``. Raises :class:`WorkDirBusyError` naming the holder's pid and host (or the
    thread of this process), without changing anything in the work dir, when another run
    holds it. ``notice`` says once when the file system cannot lock (the run then goes on
    unguarded). A block refused with a user's mistake (:class:`HookrunError`) leaves no
    trace: the folders this hold created, holding nothing but the lock file, are removed."""
    if not enabled:
        yield
        return
    work_dir = Path(work_dir)
    missing = []
    folder = work_dir.absolute()
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    key = _acquire(work_dir, hint, notice)
    try:
        yield
    except HookrunError:
        if _release(key) and missing:
            _remove_created(missing)
        raise
    except BaseException:
        _release(key)
        raise
    _release(key)


def _remove_created(folders: list[Path]) -> None:
    """Remove the lock file and ``folders`` (innermost first) when they hold nothing else."""
    with contextlib.suppress(OSError):
        if [p.name for p in folders[0].iterdir()] == [LOCK_NAME]:
            (folders[0] / LOCK_NAME).unlink()
        for created in folders:
            created.rmdir()  # refuses a folder that holds anything else


def _acquire(work_dir: Path, hint: str, notice: Callable[[str], None]) -> str:
    if work_dir.exists() and not work_dir.is_dir():
        raise HookrunError(f"work dir {work_dir} exists and is not a folder")
    path = work_dir / LOCK_NAME
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(path)
        thread = threading.get_ident()
        with _guard:
            entry = _held.get(key)
            if entry is not None:
                if entry.thread != thread:
                    raise WorkDirBusyError(
                        f"work dir {work_dir} is in use by another run of this process "
                        f"(thread {_thread_name(entry.thread)}); wait for it or {hint}"
                    )
                entry.depth += 1
                return key
            fd, writable = _open(path)
            where = os.path.realpath(work_dir)
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
                _held[key] = _Hold(-1, 1, thread, where)
                return key
            if writable:
                _stamp(fd)
            _held[key] = _Hold(fd, 1, thread, where)
            return key
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise HookrunError(f"work dir {work_dir}: cannot create {path.name} ({reason})") from exc


def _thread_name(ident: int) -> str:
    found = [t.name for t in threading.enumerate() if t.ident == ident]
    return found[0] if found else str(ident)


def _open(path: Path) -> tuple[int, bool]:
    """The lock file opened without truncating it (a refused run changes nothing)."""
    try:
        return open_for_writing(path, os.O_RDWR | os.O_CREAT), True
    except PermissionError:  # another user's file: flock works on a read-only descriptor
        return open_for_writing(path, os.O_RDONLY), False


def _stamp(fd: int) -> None:
    """Write who holds the lock; a failure to write (a full disk) leaves the lock held."""
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, (text + "\n").encode(), 0)


def _release(key: str) -> bool:
    """Leave one block holding ``key``; True when that was the last (the lock is gone)."""
    with _guard:
        entry = _held.get(key)
        if entry is None:  # dropped by a fork
            return False
        entry.depth -= 1
        if entry.depth > 0:
            return False
        del _held[key]
        if entry.fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(entry.fd, 0)  # no pid of a run that is over
            os.close(entry.fd)  # releases the lock
        return True


# -- writing in a work dir -------------------------------------------------------------------


def open_for_writing(path: str | Path, flags: int) -> int:
    """A descriptor of ``path`` opened with ``flags`` (``os.O_*``) for a file hookrun writes
    in place in a work dir (the lock, a log, an event file), refused unless it is hookrun's
    own plain file: a symbolic link is never followed (a planted link would make hookrun
    write the file it points to), a FIFO or device is never opened for good (opening a FIFO
    would block), and a file with other hard links is never written (the other names would
    change too). A refusal is :class:`HookrunError`, one line; nothing is changed. A file
    created here is recorded (:func:`record_created`)."""
    fd, created = _open_plain(Path(path), flags)
    if created:
        record_created(path)
    return fd


def _open_plain(path: Path, flags: int) -> tuple[int, bool]:
    """:func:`open_for_writing` without the record; also whether the file was created."""
    safe = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    created = False
    try:
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            try:
                fd, created = os.open(path, flags | os.O_EXCL | safe, 0o666), True
            except FileExistsError:
                fd = os.open(path, (flags & ~os.O_CREAT) | safe)
        else:
            fd, created = os.open(path, flags | safe, 0o666), bool(flags & os.O_CREAT)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HookrunError(
                f"{path} is a symbolic link; hookrun writes only its own files and never "
                "through a link (remove the link, or use another work dir)"
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, opened to write
            raise HookrunError(f"{path} is a FIFO, not a file hookrun can write") from None
        raise
    problem = _not_plain(os.fstat(fd))
    if problem:
        os.close(fd)
        raise HookrunError(f"{path} {problem}; hookrun writes only its own plain files there")
    os.set_blocking(fd, True)
    return fd, created


def _not_plain(stat: os.stat_result) -> str | None:
    """Why a file is not one hookrun may write in place, or None."""
    if not S_ISREG(stat.st_mode):
        return "is not a regular file (a FIFO, device or socket)"
    if stat.st_nlink > 1:
        return f"has {stat.st_nlink} hard links (writing it would change the other names too)"
    return None


def check_no_links(work_dir: str | Path, folder: str | Path) -> None:
    """Refuse ``folder`` (inside ``work_dir``) when it, or a folder between the two, is a
    symbolic link: files created there would land wherever the link points."""
    base, here = Path(work_dir), Path(folder)
    while here != base and here.is_relative_to(base):
        if here.is_symlink():
            raise HookrunError(
                f"{here} is a symbolic link; hookrun writes only into its own folders "
                "(remove the link, or use another work dir)"
            )
        here = here.parent


def record_created(path: str | Path) -> None:
    """List ``path``, a file hookrun has just created, in the manifest of the work dir this
    process holds it in (nothing when it is in none): the proof :func:`start_over` asks
    before it removes anything."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    real = os.path.join(folder, os.path.basename(path))
    for entry in list(_held.copy().values()):
        if os.path.commonpath([entry.work_dir, real]) != entry.work_dir:
            continue
        line = json.dumps(os.path.relpath(real, entry.work_dir)) + "\n"
        manifest = Path(entry.work_dir) / MANIFEST_NAME
        with _manifest_guard:  # the background checkpoint thread records too
            fd, _ = _open_plain(manifest, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return


def recorded(work_dir: Path) -> set[Path]:
    """The files the manifest of ``work_dir`` lists (nothing when it cannot be read: a
    link, a FIFO, damage), as paths under ``work_dir``."""
    try:
        fd, _ = _open_plain(work_dir / MANIFEST_NAME, os.O_RDONLY)
    except (OSError, HookrunError):
        return set()
    found = set()
    with os.fdopen(fd, "rb") as f:
        for line in f.read(64 << 20).splitlines():
            with contextlib.suppress(ValueError):
                name = json.loads(line)
                inside = isinstance(name, str) and not os.path.isabs(name)
                if inside and ".." not in Path(name).parts:
                    found.add(work_dir / name)
    return found


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
    proves hookrun created (:func:`record_created`): a file is never removed by its name
    alone. The line that says what was removed and what was left; None when there were no
    leftovers."""
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
    for plugin in plugins:
        declare = getattr(plugin, "checkpoint_dir", None)
        declared = declare(work_dir) if callable(declare) else None
        if declared is not None:
            folders.append(location(declared))
            break
    return list(dict.fromkeys(folders))


# -- reading a file hookrun did not necessarily write ------------------------------------------


def file_kind(mode: int) -> str:
    """What a ``st_mode`` that is not a regular file's is, for the line that refuses it."""
    kinds = {
        stat_mode.S_IFIFO: "a FIFO",
        stat_mode.S_IFCHR: "a character device",
        stat_mode.S_IFBLK: "a block device",
        stat_mode.S_IFSOCK: "a socket",
        stat_mode.S_IFDIR: "a folder",
    }
    return f"not a regular file ({kinds.get(stat_mode.S_IFMT(mode), 'not a file')})"


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened to read, refused with an ``OSError`` naming what it is unless it is a
    regular file. It is opened without blocking and checked on the descriptor, so a file
    swapped for a FIFO after any earlier check cannot block the reader either."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat_mode.S_ISREG(mode):
            raise OSError(file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise

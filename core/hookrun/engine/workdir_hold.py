"""Holding a work dir: one run at a time, and a record of every file the holder creates.

- :func:`hold`: an exclusive ``fcntl.flock`` on ``<work_dir>/.hookrun.lock`` for as long as a
  run trains (rank 0 only), with the holder's pid and host written into the file. The lock
  belongs to the process: it goes when the process ends, however it ends, so a file left
  by a killed run never blocks. A run refused before it wrote anything removes the lock file
  it created. Re-entrant within a thread (the CLI takes it, then
  ``Runner.train`` takes it again); another thread of the same process is refused as another
  process is; forked children (DataLoader workers) drop their copy, so a worker that
  outlives a killed parent does not keep the work dir locked.
- :func:`open_for_writing`: every file hookrun writes in place in a work dir is opened
  through it (:func:`hookrun.engine.workdir_files.open_plain`: never through a link).
- :func:`record_created`: every file hookrun creates in a work dir it holds is listed in
  ``<work_dir>/.hookrun.files``; hookrun removes only files listed there
  (:func:`hookrun.engine.workdir.start_over`), and :func:`created_by_hookrun` asks it for a
  plugin (the checkpoint plugin deletes and replaces only files it lists).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hookrun.engine.workdir_files import open_plain
from hookrun.errors import HookrunError, WorkDirBusyError

LOCK_NAME = ".hookrun.lock"
MANIFEST_NAME = ".hookrun.files"  # the files hookrun created here, one JSON string a line
# file systems mounted without lock support (Lustre `noflock`, some NFS set-ups)
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


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
    unguarded). A block that fails before its run wrote anything in the work dir (a
    refusal, a task that raised while it was built, Ctrl-C) leaves no trace
    (:func:`_undo_start`)."""
    if not enabled:
        yield
        return
    work_dir = Path(work_dir)
    missing = []
    folder = work_dir.absolute()
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    fresh = not os.path.lexists(work_dir / LOCK_NAME)  # a folder of yours keeps no lock file
    key = _acquire(work_dir, hint, notice)
    try:
        yield
    except BaseException:
        if _release(key):
            _undo_start(work_dir, missing, fresh)
        raise
    _release(key)


def _undo_start(work_dir: Path, created: list[Path], fresh_lock: bool) -> None:
    """After a failed block, when its run recorded no file in the work dir: remove the
    ``created`` folders (innermost first) if they hold nothing but the lock file and the
    record, or in a folder that was there, the lock file the hold added. A folder hookrun
    held before keeps its lock file; one the run wrote in keeps everything."""
    if not fresh_lock or recorded(work_dir):
        return
    with contextlib.suppress(OSError):
        if not created:
            (work_dir / LOCK_NAME).unlink()
            return
        if {p.name for p in created[0].iterdir()} <= {LOCK_NAME, MANIFEST_NAME}:
            for name in (LOCK_NAME, MANIFEST_NAME):
                (created[0] / name).unlink(missing_ok=True)
            for folder in created:
                folder.rmdir()  # refuses a folder that holds anything else


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


# -- writing in a work dir it holds ----------------------------------------------------------------


def open_for_writing(path: str | Path, flags: int) -> int:
    """A descriptor of ``path`` opened with ``flags`` (``os.O_*``) for a file hookrun writes
    in place in a work dir (the lock, a log, an event file), refused unless it is hookrun's
    own plain file: a symbolic link is never followed (a planted link would make hookrun
    write the file it points to), a FIFO or device is never opened for good (opening a FIFO
    would block), and a file with other hard links is never written (the other names would
    change too). A refusal is :class:`HookrunError`, one line; nothing is changed. A file
    created here is recorded (:func:`record_created`)."""
    fd, created = open_plain(Path(path), flags)
    if created:
        record_created(path)
    return fd


def record_created(path: str | Path) -> None:
    """List ``path``, a file hookrun has just created, in the manifest of the work dir this
    process holds it in (nothing when it is in none): the proof :func:`start_over` asks
    before it removes anything."""
    found = _held_work_dir(path)
    if found is None:
        return
    work_dir, real = found
    line = json.dumps(os.path.relpath(real, work_dir)) + "\n"
    with _manifest_guard:  # the background checkpoint thread records too
        fd, _ = open_plain(work_dir / MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def created_by_hookrun(path: str | Path) -> bool | None:
    """Whether hookrun's record of the work dir this process holds ``path`` in
    (``<work_dir>/.hookrun.files``) lists it as a file hookrun created there; ``None`` when
    ``path`` lies in no work dir this process holds (no record to ask: an object store, a
    folder outside the work dir, a process that holds no work dir). A plugin deletes or
    replaces a file in the work dir only when this is ``True``: never your own file because
    its name looks like one of the plugin's."""
    found = _held_work_dir(path)
    if found is None:
        return None
    work_dir, real = found
    with _manifest_guard:  # not a line half-written by the background checkpoint thread
        return real in recorded(work_dir)


def _held_work_dir(path: str | Path) -> tuple[Path, Path] | None:
    """The work dir this process holds that ``path`` lies in, and ``path`` with its folder's
    links resolved (as the work dir's are); None when it lies in none."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    real = os.path.join(folder, os.path.basename(path))
    for entry in list(_held.copy().values()):
        if os.path.commonpath([entry.work_dir, real]) == entry.work_dir:
            return Path(entry.work_dir), Path(real)
    return None


def recorded(work_dir: Path) -> set[Path]:
    """The files the manifest of ``work_dir`` lists (nothing when it cannot be read: a
    link, a FIFO, damage), as paths under ``work_dir``."""
    try:
        fd, _ = open_plain(work_dir / MANIFEST_NAME, os.O_RDONLY)
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

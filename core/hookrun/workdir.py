"""One run at a time per work dir.

- :func:`hold`: an exclusive ``fcntl.flock`` on ``<work_dir>/.hookrun.lock`` for as long as a
  run trains (rank 0 only), with the holder's pid and host written into the file. The lock
  belongs to the process: it goes when the process ends, however it ends, so a file left
  by a killed run never blocks. Re-entrant within a process (the CLI takes it, then
  ``Runner.train`` takes it again); forked children (DataLoader workers) drop their copy, so
  a worker that outlives a killed parent does not keep the work dir locked.
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
from pathlib import Path

from hookrun.errors import HookrunError

LOCK_NAME = ".hookrun.lock"
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

"""Opening files in a work dir without being led elsewhere: a file hookrun writes in place is
never reached through a symbolic link, never a FIFO, device or hard-linked file
(:func:`open_plain`, which :func:`hookrun.engine.workdir_hold.open_for_writing` records), no
folder it writes into is a link (:func:`check_no_links`), and a file it reads that it did
not necessarily write cannot block the reader (:func:`open_regular`).
"""

from __future__ import annotations

import errno
import os
import stat as stat_mode
from pathlib import Path
from typing import BinaryIO

from hookrun.errors import HookrunError


def open_plain(path: Path, flags: int) -> tuple[int, bool]:
    """:func:`~hookrun.engine.workdir_hold.open_for_writing` without the record; also whether
    the file was created."""
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
    if not stat_mode.S_ISREG(stat.st_mode):
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

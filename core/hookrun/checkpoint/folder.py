"""A checkpoint folder's contents: its checkpoints newest first, the one its ``latest``
pointer names first, the pointer trusted with nothing (:func:`candidates`, :func:`pointed`).
Which of them a run resumes from is :mod:`hookrun.checkpoint.resume`'s to decide.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hookrun.checkpoint.files import not_regular
from hookrun.checkpoint.storage import URL
from hookrun.engine.workdir_files import open_regular


def candidates(folder: Path | URL, report: Callable[[str], None] | None = None) -> list[Path | URL]:
    """Checkpoint files (``*.pt``) and sharded checkpoint folders (named the same way) in
    ``folder``, newest first.

    A ``latest`` text file naming a checkpoint of the folder puts that one first; the rest
    go by modification time, ties broken by the numbers in their names (iter_10 > iter_8).
    ``latest`` is trusted with nothing: unless it holds one plain file name (no ``/``,
    ``\\`` or ``..``) of a ``*.pt`` file of the folder it is ignored, and ``report`` says why.
    Anything else named ``*.pt`` (a FIFO, a device, a link to one) is skipped, and ``report``
    names it and what it is. On an object store the modification time is the upload's.
    """
    if isinstance(folder, URL):
        return _object_candidates(folder, report)
    if not folder.is_dir():
        return []
    files: list[Path] = []
    for path in folder.glob("*.pt"):
        problem = None if path.is_dir() else not_regular(path)  # dirs: sharded checkpoints
        if problem is None and os.path.exists(path):
            files.append(path)
        elif problem is not None and report is not None:
            report(f"skipping {path}: {problem}")
    files.sort(key=lambda p: (p.stat().st_mtime_ns, _natural(p.name)), reverse=True)
    newest: list[Path | URL] = [*files]
    return _latest_first(folder, newest, report)


def _object_candidates(folder: URL, report: Callable[[str], None] | None) -> list[Path | URL]:
    """:func:`candidates` of a folder on an fsspec file system (objects only: no FIFOs)."""
    found = [entry for entry in folder.iterdir() if entry.suffix == ".pt" and entry.is_file()]
    found.sort(key=lambda entry: (entry.mtime(), _natural(entry.name)), reverse=True)
    files: list[Path | URL] = [*found]
    return _latest_first(folder, files, report)


def _latest_first(
    folder: Path | URL, files: list[Path | URL], report: Callable[[str], None] | None
) -> list[Path | URL]:
    """``files`` with the one the ``latest`` pointer names first (the pointer checked)."""
    pointer = folder / "latest"
    if pointer.is_file():
        named, problem = _pointer_name(pointer)
        if named is not None and folder / named in files:
            files.remove(folder / named)
            files.insert(0, folder / named)
        elif report is not None:
            report(f"ignoring {pointer}: {problem or f'{named!r} is not a checkpoint here'}")
    return files


def pointed(folder: Path | URL) -> str | None:
    """The plain file name the ``latest`` pointer of ``folder`` holds, if it holds one."""
    pointer = folder / "latest"
    return _pointer_name(pointer)[0] if pointer.is_file() else None


def _pointer_name(pointer: Path | URL) -> tuple[str | None, str]:
    """The plain file name ``pointer`` holds, or None and why not."""
    try:
        if isinstance(pointer, URL):
            raw = pointer.read_bytes()[:4097]
        else:
            with open_regular(pointer) as f:
                raw = f.read(4097)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    if len(raw) > 4096:
        return None, "it is not a file name (over 4 KiB)"
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, "it is not text"
    if not name:
        return None, "it is empty"
    if not name.isprintable() or "/" in name or "\\" in name or name in (".", ".."):
        return None, f"{name!r} is not a plain file name"
    return name, ""


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

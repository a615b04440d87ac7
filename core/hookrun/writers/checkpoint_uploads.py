"""Which checkpoint files a tracker writer uploads at a run's end, and how it tells those it
already uploaded: shared by the tracker distributions, so each uploads the same files."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

CHECKPOINT_CHOICES = ("best", "last", "none")
"""What a tracker writer may upload at a run's end (its ``log_checkpoints`` option)."""


def checkpoint_files(folder: Path, which: str, done: Collection[str] = ()) -> list[Path]:
    """The checkpoint files a tracker uploads (``log_checkpoints``): ``best`` every
    ``best_*.pt`` of ``folder``, ``last`` the file its ``latest`` pointer names (a plain
    name of the folder only), ``none`` nothing; less those whose
    :func:`checkpoint_signature` is in ``done`` (uploaded by an earlier pass)."""
    from hookrun.checkpoint.folder import pointed

    if which == "best":
        files = sorted(p for p in folder.glob("best_*.pt") if p.is_file())
    else:
        name = pointed(folder) if which == "last" else None
        files = [folder / name] if name and (folder / name).is_file() else []
    return [path for path in files if checkpoint_signature(path) not in done]


def checkpoint_signature(path: Path) -> str:
    """``name size mtime_ns``: tells a file a tracker already uploaded from a rewritten one."""
    stat = path.stat()
    return f"{path.name} {stat.st_size} {stat.st_mtime_ns}"

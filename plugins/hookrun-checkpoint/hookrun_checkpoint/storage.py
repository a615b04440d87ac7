"""Where the checkpoint plugin's files live: one folder behind a small interface.

Every file operation of the plugin (write, list, read, exists, remove) goes through a
:class:`Storage`, addressed by plain file names; :class:`LocalStorage` is the local file
system's, :class:`FsspecStorage` an fsspec file system's (``s3://``, ``gs://``,
``memory://``). The checkpoint files themselves are written by the core
(``runner.write_checkpoint``: atomic, checked to load with ``weights_only=True``); the
storage says where.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from hookrun import (
    URL,
    CheckpointError,
    atomic_write_text,
    checkpoint_state_file,
    created_by_hookrun,
    remove_checkpoint,
)

# What the core's atomic write leaves behind when killed: ``.<name>.<12 hex digits>.tmp``
# (``hookrun.checkpoint.files``), or a sharded save's ``.<name>.partial`` folder.
TEMP = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")
PARTIAL = re.compile(r"\.(?P<name>.+)\.partial")


Writer = Callable[[dict[str, Any], Any], Any]
"""The core's checkpoint writer (``runner.write_checkpoint``): a state and where."""


class Storage(Protocol):
    """The checkpoint folder as the plugin sees it: files by plain name, each written
    atomically under its final name (a reader never sees half a file)."""

    @property
    def folder(self) -> Path | URL:
        """The folder, for messages: the one ``runner.checkpoint_dir`` names."""

    def path(self, name: str) -> Path | URL:
        """Where ``name`` is, for the core's writer and for messages."""

    def holds(self, path: Path | URL) -> bool:
        """Whether ``path`` (the file a run resumed from) is one of this folder's files."""

    def inside(self, name: str) -> bool:
        """Whether ``name`` stays in the folder (a link out of it does not)."""

    def names(self) -> list[str]:
        """The names in the folder, sorted."""

    def exists(self, name: str) -> bool:
        """Whether ``name`` is there."""

    def write(self, write: Writer, state: Any, name: str) -> None:
        """Write checkpoint ``name`` with the core's atomic ``write``."""

    def write_text(self, name: str, text: str) -> None:
        """Replace the small text file ``name`` atomically."""

    def read_state(self, name: str) -> Any:
        """The non-tensor state of checkpoint ``name``; raises when it does not load."""

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name`` (nothing when it is gone)."""

    def created(self, name: str) -> bool:
        """Whether the plugin may delete or replace ``name``: hookrun's record says it
        created the file, or there is no record to ask."""


class LocalStorage:
    """The checkpoint folder on the local file system (a :class:`Storage`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str) -> Path:
        """The path of ``name``, for the core's writer and for messages."""
        return self.folder / name

    def holds(self, path: Path | URL) -> bool:
        """Whether ``path`` lies directly in this folder (the file a run resumed from)."""
        return isinstance(path, Path) and path.parent.resolve() == self.folder.resolve()

    def inside(self, name: str) -> bool:
        """Whether ``name`` resolves to a path directly in the folder (no link out of it)."""
        folder = self.folder.resolve()
        return (folder / name).resolve().parent == folder

    def exists(self, name: str) -> bool:
        """Whether ``name`` is there: a file, or a sharded checkpoint's folder."""
        return (self.folder / name).exists()

    def names(self) -> list[str]:
        """The names in the folder, sorted (nothing when there is no folder yet)."""
        if not self.folder.is_dir():
            return []
        return sorted(entry.name for entry in self.folder.iterdir())

    def write(self, write: Writer, state: Any, name: str) -> None:
        """Write checkpoint ``name`` with the core's atomic ``write``."""
        write(state, self.folder / name)

    def write_text(self, name: str, text: str) -> None:
        """Replace the small text file ``name`` (the ``latest`` pointer) atomically."""
        path = self.folder / name
        try:
            atomic_write_text(text, path)
        except OSError as exc:
            raise CheckpointError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def read_state(self, name: str) -> Any:
        """The non-tensor state of checkpoint ``name`` without loading its tensors (mmap);
        raises when it does not load."""
        file = checkpoint_state_file(self.folder / name)  # a sharded folder's state.pt
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)

    def remove(self, name: str) -> None:
        """Delete checkpoint ``name``, a file or a sharded folder (nothing when gone)."""
        remove_checkpoint(self.folder / name)

    def created(self, name: str) -> bool:
        """Whether hookrun's record of the work dir that holds the folder
        (:func:`hookrun.created_by_hookrun`) lists ``name``; True for a folder outside every
        work dir this process holds (no record there: the plugin's own record decides)."""
        return created_by_hookrun(self.folder / name) is not False


class FsspecStorage:
    """The checkpoint folder on an fsspec file system (a :class:`Storage`): an object store
    (``s3://``, ``gs://``) or ``memory://``. Each checkpoint is uploaded whole under its
    final name (the core's write), so no temporary object is ever made; folders are only
    prefixes, so every name is one object directly under :attr:`folder`."""

    def __init__(self, folder: URL) -> None:
        self.folder = folder

    def path(self, name: str) -> URL:
        """The URL of ``name``, for the core's writer and for messages."""
        return self.folder / name

    def holds(self, path: Path | URL) -> bool:
        """Whether ``path`` (the file a run resumed from) is an object directly here."""
        return isinstance(path, URL) and path.parent == self.folder

    def inside(self, name: str) -> bool:
        """Always: an object store has no links out of a prefix (names are plain already)."""
        return True

    def exists(self, name: str) -> bool:
        """Whether the object ``name`` is there."""
        return (self.folder / name).exists()

    def names(self) -> list[str]:
        """The names directly under the folder, sorted (listed afresh)."""
        return [entry.name for entry in self.folder.iterdir()]

    def write(self, write: Writer, state: Any, name: str) -> None:
        """Upload checkpoint ``name`` whole with the core's ``write``."""
        write(state, self.folder / name)

    def write_text(self, name: str, text: str) -> None:
        """Replace the small object ``name`` (the ``latest`` pointer) in one upload."""
        url = self.folder / name
        try:
            atomic_write_text(text, url)
        except Exception as exc:
            raise CheckpointError(f"cannot write {url}: {' '.join(str(exc).split())}") from exc

    def read_state(self, name: str) -> Any:
        """Checkpoint ``name`` (read whole: an object cannot be memory-mapped); raises when
        it does not load."""
        data = (self.folder / name).read_bytes()
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def remove(self, name: str) -> None:
        """Delete the object ``name`` (nothing when it is gone)."""
        remove_checkpoint(self.folder / name)

    def created(self, name: str) -> bool:
        """Always: a store keeps no record of who wrote an object, so the plugin's own record
        decides (a start without a resume refuses a URL that holds checkpoints)."""
        return True

"""Checkpoint files: format ``hookrun/1``, atomic writes, safe loads.

Every value is something ``torch.load(path, weights_only=True)`` accepts, so loading never
needs (and never falls back to) unpickling arbitrary objects.

A checkpoint location is a local ``Path`` or a :class:`~hookrun.checkpoint.storage.URL` of an
fsspec file system (``s3://``, ``gs://``, ``memory://``). Local files keep the atomic write
(temporary file, fsync, rename); an object is uploaded whole under its final name in one
request, which an object store shows only once complete: there is no rename to make it so.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import secrets
import shutil
import stat
import warnings
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hookrun.checkpoint.storage import URL, location
from hookrun.engine.workdir_files import file_kind, open_regular
from hookrun.engine.workdir_hold import record_created
from hookrun.errors import CheckpointError, CheckpointMismatchError

FORMAT = "hookrun/1"


def atomic_save(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save`` so that ``path`` is either the old file or the new one.

    A temporary file in the same folder is written, flushed and fsynced, then renamed over
    ``path``, and the folder is fsynced so the rename itself survives a power cut. The file
    gets the permissions of any new file under the process's umask (0644 under umask 022).

    ``torch.save`` hides an exception raised by the file's ``write`` behind a
    ``RuntimeError: [enforce fail at inline_container.cc:...]``; the original one (an
    ``OSError`` of a full disk, a ``KeyboardInterrupt``) is raised instead.
    """

    def fill(f: Any) -> None:
        recording = _RecordingFile(f)
        try:
            torch.save(obj, recording)  # type: ignore[arg-type]  # write and flush suffice
        except BaseException as exc:
            if recording.error is not None and recording.error is not exc:
                raise recording.error.with_traceback(recording.error.__traceback__) from None
            raise

    return _atomic(path, fill)


class _RecordingFile:
    """A binary file whose ``write`` keeps the first exception it raised."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self.f.write(data))
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _atomic(path: str | Path, fill: Callable[[Any], object]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = os.path.lexists(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a link planted at ``path``, never its target
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    if not existed:
        record_created(path)  # in the manifest of the work dir held, if any
    return path


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new ``.<name>.<random>.tmp`` beside ``path``, created with mode 0666 so that the
    kernel applies the umask (``tempfile.mkstemp`` would make it 0600)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, _TEMP_FLAGS | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write(state: dict[str, Any], path: str | Path | URL) -> Path | URL:
    """Check that ``state`` will load with ``weights_only=True``, then write it atomically:
    a local file through a renamed temporary file, an object in one whole upload.

    Failures raise :class:`CheckpointError` naming the file and, for an I/O error, the
    operating system's reason (``No space left on device``); the previous file is intact.
    A ``KeyboardInterrupt`` during the write is raised as such, the previous file intact.
    """
    path = location(path)
    problem = unsafe_value(state)
    if problem:
        raise CheckpointError(f"cannot save {path}: {problem}")
    try:
        if isinstance(path, URL):
            buffer = io.BytesIO()
            torch.save(state, buffer)
            path.write_bytes(buffer.getvalue())
            return path
        return atomic_save(state, path)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from exc
    except Exception as exc:
        if not isinstance(path, URL):
            raise
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise CheckpointError(f"cannot write checkpoint {path}: {text}") from exc


SHARDED_STATE_FILE = "state.pt"
"""The file of a sharded checkpoint folder holding everything but the tensors."""


def checkpoint_state_file(path: str | Path) -> Path:
    """The file holding checkpoint ``path``'s non-tensor state (loop, plugins): the file
    itself, or a sharded checkpoint folder's ``state.pt`` (both load with
    ``torch.load(weights_only=True)``). Raises :class:`CheckpointMismatchError` when that is
    not a regular file: a FIFO named like a checkpoint would block its reader forever."""
    path = Path(path)
    file = path / SHARDED_STATE_FILE if path.is_dir() else path
    problem = not_regular(file)
    if problem:
        raise _unloadable(file, problem)
    return file


def remove_checkpoint(path: str | Path | URL) -> None:
    """Delete a checkpoint file or a sharded checkpoint folder (nothing when it is gone)."""
    path = location(path)
    if isinstance(path, URL):
        path.unlink(missing_ok=True)
    elif path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def atomic_write_text(text: str, path: str | Path | URL) -> None:
    """Replace a small text file (a pointer such as ``latest``) atomically."""
    path = location(path)
    if isinstance(path, URL):
        path.write_bytes(text.encode("utf-8"))
    else:
        _atomic(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def not_regular(path: str | Path) -> str | None:
    """Why ``path`` (links followed) is no file to read a checkpoint from, or None: a FIFO
    blocks its reader, a device such as ``/dev/zero`` never ends."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # the reader names it (not found, no permission)
    return None if stat.S_ISREG(mode) else file_kind(mode)


def load(path: str | Path | URL, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; anything else is refused. ``mmap``
    maps the tensors instead of reading them (to look at a position or check a fit).

    A file that is not a regular file (a FIFO, a device), cannot be read, is not a
    ``torch.save`` file, holds something the ``weights_only`` loader refuses (a pickled
    class, a ``__reduce__`` payload) or is not a ``hookrun/1`` dict raises
    :class:`CheckpointMismatchError` with one line: ``cannot load checkpoint PATH: REASON``
    (torch's multi-line advice condensed to its gist). Every checkpoint hookrun reads goes
    through here. An object of a :class:`URL` is read whole (``mmap`` does not apply).
    """
    if isinstance(path, URL):
        return _load_object(path, map_location)
    try:
        with open_regular(path) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the reason says it
            mmap = mmap and zipfile.is_zipfile(f)  # torch maps only its zip format
            f.seek(0)
            # mmap needs a name: the descriptor's own (Linux), so the file checked is the file read
            proc = f"/proc/self/fd/{f.fileno()}"
            source: Any = (proc if os.path.exists(proc) else str(path)) if mmap else f
            checkpoint = torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:
        raise _unloadable(path, load_error_reason(exc, path)) from exc
    return _checked(checkpoint, path)


def _load_object(url: URL, map_location: Any) -> dict[str, Any]:
    """:func:`load` for an object of an fsspec file system: read whole, then loaded."""
    try:
        data = url.read_bytes()
    except FileNotFoundError as exc:
        raise _unloadable(url, "not found") from exc
    if not data:
        raise _unloadable(url, "the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buffer = io.BytesIO(data)
            checkpoint = torch.load(buffer, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise _unloadable(url, load_error_reason(exc, url, len(data), data[:512])) from exc
    return _checked(checkpoint, url)


def _checked(checkpoint: Any, path: str | Path | URL) -> dict[str, Any]:
    """``checkpoint`` when it is a ``hookrun/1`` dict, else why not (one line)."""
    if not isinstance(checkpoint, dict):
        kind = type(checkpoint).__name__
        raise _unloadable(path, f"not a hookrun checkpoint (it holds a {kind}, not a dict)")
    if "format" not in checkpoint:
        keys = ", ".join(map(str, list(checkpoint)[:5])) or "none"
        raise _unloadable(path, f"not a hookrun checkpoint (a dict without 'format'; keys: {keys})")
    if checkpoint["format"] != FORMAT:
        raise _unloadable(path, f"format {checkpoint['format']!r} is not {FORMAT!r}")
    return checkpoint


def _unloadable(path: str | Path | URL, reason: str) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"cannot load checkpoint {path}: {reason}", path=path, reason=reason
    )


_ENFORCE = re.compile(r"^\[enforce fail at [^\]]*\]\s*\.?\s*")
_WEIGHTS_ONLY_NOISE = (
    "Weights only load failed",
    "Check the documentation of torch.load",
    "Please file an issue",
)


def load_error_reason(
    exc: BaseException, path: str | Path | URL, size: int | None = None, head: bytes | None = None
) -> str:
    """One line for an exception of ``torch.load``: what is wrong with the file (of ``size``
    bytes, starting with ``head``; both looked up when not given). A file torch.save did not
    write is said to be no checkpoint in plain words (a YAML file given to ``--resume``:
    ``not a checkpoint (a text file, which torch cannot load)``), not with the unpickler's
    error (``IndexError: pop from empty list``)."""
    if isinstance(exc, OSError) and exc.errno != errno.EINVAL:
        return exc.strerror or _short(str(exc)) or type(exc).__name__  # not found, no permission
    if size is None:
        try:
            size = os.path.getsize(str(path))
        except OSError:
            size = -1
    if size == 0:
        return "the file is empty (0 bytes)"
    if head is None:
        head = _head(path)
    if _is_text(head):
        return "not a checkpoint (a text file, which torch cannot load)"
    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in str(exc):
        lines = [line.strip() for line in str(exc).splitlines()]
        gist = [
            line.partition("WeightsUnpickler error:")[2].strip() or line
            for line in lines
            if line and (not line.startswith(_WEIGHTS_ONLY_NOISE) or "error:" in line)
        ]
        gist = [line for line in gist if line and not line.startswith(_WEIGHTS_ONLY_NOISE)]
        return f"not a hookrun checkpoint (weights_only load refused: {_short(' '.join(gist))})"
    if isinstance(exc, EOFError):
        return f"the file ends too early ({size} bytes; truncated?)"
    if isinstance(exc, OSError):  # EINVAL: the zip reader seeking before the start of a cut file
        return f"damaged, or not a torch.save file (reading it failed: {exc.strerror or exc})"
    text = _short(_ENFORCE.sub("", str(exc).strip().splitlines()[0] if str(exc).strip() else ""))
    if "PytorchStreamReader" in text or "archive" in text or "zip" in text.lower():
        return f"damaged, or not a torch.save file ({text})"
    if isinstance(exc, pickle.UnpicklingError):
        return f"not a torch.save file ({text or type(exc).__name__})"
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if head and not head.startswith(b"PK"):  # not torch's zip: the unpickler's own error
        return f"not a checkpoint (torch could not read it: {error})"
    return error


def _head(path: str | Path | URL) -> bytes:
    """The first bytes of a local file (nothing for an object or a file that cannot be read)."""
    if isinstance(path, URL):
        return b""
    try:
        with open_regular(path) as f:
            return f.read(512)
    except OSError:
        return b""


def _is_text(head: bytes) -> bool:
    """Whether a file starting with ``head`` is text (UTF-8, printable): YAML, JSON, a
    script. torch.save writes a zip archive or a pickle, neither of them text."""
    if not head or b"\0" in head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not a character cut at the end of the head
            return False
        text = head[: exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\n\r\f" for c in text)


def _short(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` when it is long, at most ``limit`` characters."""
    text = " ".join(text.split())
    if len(text) > limit or ". " in text:
        first = text.split(". ")[0]
        text = first if first else text
    text = text.rstrip(".")
    return text if len(text) <= limit else text[: limit - 3] + "..."


SAFE_SCALARS = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
SAFE_MAPPINGS = (dict, OrderedDict, Counter)
"""Mappings the weights-only loader rebuilds as themselves: ``Counter`` holds the milestones
of a ``MultiStepLR`` (also nested in ``SequentialLR``/``ChainedScheduler`` states)."""


def unsafe_value(obj: Any, where: str = "checkpoint") -> str | None:
    """Where ``obj`` holds something ``weights_only=True`` loading would refuse, or None."""
    if isinstance(obj, torch.Tensor) or type(obj) in SAFE_SCALARS:  # exact: np.float64 is a float
        return None
    if type(obj) in (list, tuple):
        items: Any = enumerate(obj)
    elif type(obj) in SAFE_MAPPINGS:
        items = obj.items()
        for key in obj:
            if not isinstance(key, (str, int)):
                return f"{where} has a key of type {type(key).__name__}: {key!r}"
    else:
        return (
            f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which "
            "torch.load(weights_only=True) refuses; store tensors, numbers, strings, lists, dicts"
        )
    for key, value in items:
        problem = unsafe_value(value, f"{where}[{key!r}]")
        if problem:
            return problem
    return None

"""Checkpoint locations: a local ``Path``, or a :class:`URL` of an fsspec file system
(``s3://``, ``gs://``, ``memory://``) for checkpoints kept in object storage. Credentials and
endpoints come from the file system's own configuration; nothing here is contacted until a
run asks (:meth:`URL.check`). The work dir itself stays local (:func:`url_work_dir_problem`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from hookrun.errors import ConfigError

_URL = re.compile(r"(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://")
LIBRARIES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs"}
"""The library fsspec needs for a protocol, for the line that names what to install."""


def is_url(value: object) -> bool:
    """Whether ``value`` is a URL (``s3://...``) rather than a local path."""
    return isinstance(value, URL) or (isinstance(value, str) and _URL.match(value) is not None)


def location(value: str | os.PathLike[str] | URL) -> Path | URL:
    """A checkpoint folder or file as hookrun keeps it: ``file://`` URLs and plain paths as
    a ``Path`` (local disk keeps its atomic rename and fsync), any other URL as a
    :class:`URL`."""
    if isinstance(value, URL):
        return value
    if isinstance(value, str) and value.startswith("file://"):
        return Path(value.removeprefix("file://"))
    return URL(value) if isinstance(value, str) and is_url(value) else Path(value)


def url_problem(value: str) -> str | None:
    """Why the URL ``value`` names no storage hookrun can use, or None (also for a plain
    path): a protocol fsspec does not know, or one whose library is not installed (named,
    with the line that installs it). Nothing is contacted."""
    if not is_url(value):
        return None
    import fsspec

    protocol = value.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        return f"unknown storage protocol {protocol + '://'!r} (fsspec knows none by that name)"
    except ImportError:
        library = LIBRARIES.get(protocol, f"the library fsspec needs for {protocol}://")
        return f"{protocol}:// needs {library}: pip install {library}"
    return None


def url_work_dir_problem(value: str) -> str | None:
    """Why a URL cannot be a work dir: its lock, config, logs and TensorBoard files are local
    files written in place; checkpoints go to a URL through the checkpoint plugin."""
    if not is_url(value) or value.startswith("file://"):
        return None
    return (
        "a URL is no work dir (its lock, config.yaml, logs and TensorBoard files are local); "
        "give a local folder and send checkpoints to the URL with plugins.checkpoint.out_dir"
    )


class StorageError(ConfigError):
    """The storage a URL names cannot be reached or has no such bucket (exit 2)."""


class URL:
    """A checkpoint folder or file on an fsspec file system (``s3://bucket/run``), kept as
    its URL (a ``Path`` would fold the ``//``), with the few ``Path`` operations hookrun uses
    on checkpoint locations. Credentials and endpoints come from the file system's own
    configuration (for S3: ``AWS_*`` environment variables, ``~/.aws``)."""

    def __init__(self, url: str) -> None:
        problem = url_problem(url)
        if problem:
            raise ConfigError(f"{url}: {problem}")
        import fsspec

        self.url = url.rstrip("/") if not url.endswith("://") else url
        """The URL, without a trailing ``/``."""
        self.protocol = url.split("://", 1)[0]
        """The protocol (``s3``)."""
        self.fs, self.key = fsspec.core.url_to_fs(self.url)

    def __str__(self) -> str:
        """The URL, as given (without a trailing ``/``)."""
        return self.url

    def __repr__(self) -> str:
        return f"URL({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URL) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> URL:
        """The URL of ``name`` in this folder."""
        return URL(f"{self.url}/{name}")

    @property
    def name(self) -> str:
        """The last part of the path (``iter_8.pt``)."""
        return PurePosixPath(self.key).name

    @property
    def suffix(self) -> str:
        """The name's extension (``.pt``)."""
        return PurePosixPath(self.key).suffix

    @property
    def parent(self) -> URL:
        """The folder this URL is in."""
        return URL(self.url.rsplit("/", 1)[0])

    def check(self) -> None:
        """Raise :class:`StorageError` (one line) unless the storage answers and, on a store
        with buckets, the bucket exists: checked before a run writes anything."""
        bucket = self.key.split("/", 1)[0] if self.protocol in LIBRARIES else ""
        try:
            self._ask(self.fs.ls, bucket or self.key)  # ``exists`` would hide a failure
        except FileNotFoundError:
            if bucket:
                raise StorageError(f"{self.url}: the bucket {bucket!r} does not exist") from None

    def exists(self) -> bool:
        """Whether an object or a folder (a prefix with objects) is there."""
        return bool(self._ask(self.fs.exists, self.key))

    def is_dir(self) -> bool:
        """Whether this is a folder (on an object store: a prefix that holds objects)."""
        return bool(self._ask(self.fs.isdir, self.key))

    def is_file(self) -> bool:
        """Whether this is an object (a file)."""
        return bool(self._ask(self.fs.isfile, self.key))

    def iterdir(self) -> list[URL]:
        """The entries of the folder, sorted (fresh: no listing cached from before)."""
        self.fs.invalidate_cache(self.key)
        if not self.is_dir():
            return []
        keys = self._ask(self.fs.ls, self.key, detail=False)
        return [self / PurePosixPath(key).name for key in sorted(keys) if key != self.key]

    def mtime(self) -> float:
        """When the object was last written (0 when the file system does not say)."""
        try:
            return float(self.fs.modified(self.key).timestamp())
        except (NotImplementedError, OSError, ValueError, AttributeError):
            return 0.0

    def read_bytes(self) -> bytes:
        """The whole object."""
        return bytes(self._ask(self.fs.cat_file, self.key))

    def write_bytes(self, data: bytes) -> None:
        """Write the whole object under its name in one request: an object store shows it
        only once complete, and a failed upload leaves nothing under the name."""
        self.fs.pipe_file(self.key, data)

    def unlink(self, missing_ok: bool = False) -> None:
        """Delete the object (``missing_ok``: nothing when it is gone)."""
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def _ask(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call``, with a failure to reach the storage as one :class:`StorageError` line."""
        try:
            return call(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise StorageError(f"{self.url}: cannot reach the storage: {text}") from exc

"""The base of tracker writers, and which checkpoint files they upload at a run's end.

Every writer that sends a run to an experiment tracker (MLflow, W&B, DVCLive, Neptune, a
third party's) takes the same ``log_checkpoints`` and ``checkpoint_dir`` options, checks
its options the same way and uploads each checkpoint file once: ``TrackerWriter`` holds
that, so the trackers report the same problems in the same words and upload the same files.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

from hookrun.checkpoint.folder import pointed
from hookrun.writers.base import Writer

CHECKPOINT_CHOICES = ("best", "last", "none")
"""What a tracker writer may upload at a run's end (its ``log_checkpoints`` option)."""


class TrackerWriter(Writer):
    """Base class of writers that keep a run in an experiment tracker.

    A subclass names its library (:attr:`library`, :attr:`install`) and, when it has them,
    its ``mode`` values and the ``init_kwargs`` keys it sets itself; its constructor takes
    ``log_checkpoints`` and ``checkpoint_dir`` and hands them to ``super().__init__``. Its
    ``finish`` uploads :meth:`checkpoints_to_upload` and records each file with
    :meth:`mark_uploaded`; :meth:`state_dict` keeps that record, so a resumed run or a later
    pass does not upload a file again (a subclass adds its run id to the dict).
    """

    library: ClassVar[str] = ""
    """The module the tracker needs (``"mlflow"``): a config error names it when it cannot
    be imported, before the run starts. Empty: nothing is checked."""

    install: ClassVar[str] = ""
    """What ``pip install`` takes to get :attr:`library` (``"'mlflow-skinny>=3.0'"``), quoted
    where the shell needs it; empty: the library's own name."""

    modes: ClassVar[tuple[str, ...]] = ()
    """The values the writer's ``mode`` option takes; empty: the writer has no ``mode``."""

    owned_init_kwargs: ClassVar[frozenset[str]] = frozenset()
    """Keys the writer's ``init_kwargs`` option may not hold, because the writer passes them
    to the tracker itself from its own options."""

    def __init__(
        self,
        work_dir: str | Path,
        log_checkpoints: str = "none",
        checkpoint_dir: str | Path | None = None,
    ) -> None:
        super().__init__(work_dir)
        self.log_checkpoints = log_checkpoints
        """Which checkpoint files the run's end uploads: one of :data:`CHECKPOINT_CHOICES`."""
        self.checkpoint_dir = self.work_dir / checkpoint_dir if checkpoint_dir else None
        """The folder, under the work dir, that ``log_checkpoints`` looks in; None: the run's
        own (:attr:`run_checkpoint_dir`), known only once a Runner opens the writer."""
        self.uploaded_checkpoints: list[str] = []
        """The :func:`checkpoint_signature` of each file uploaded, by this pass or one before
        it (restored from the state): what :meth:`checkpoints_to_upload` leaves out."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """The library is there, the subclass's own options are right
        (:meth:`check_own_options`), ``mode`` and ``log_checkpoints`` are among their
        choices, and ``init_kwargs`` sets nothing the writer sets: lines in the order a
        tracker's constructor takes its options (its own first)."""
        errors = []
        if cls.library and _missing(cls.library):
            install = cls.install or cls.library
            errors.append(f"the {cls.library} library is missing: pip install {install}")
        errors += cls.check_own_options(options)
        mode = options.get("mode")
        if cls.modes and mode is not None and mode not in cls.modes:
            errors.append(f"mode: expected one of {', '.join(cls.modes)} (got {mode!r})")
        choice = options.get("log_checkpoints", "none")
        if choice not in CHECKPOINT_CHOICES:
            errors.append(
                f"log_checkpoints: expected one of {', '.join(CHECKPOINT_CHOICES)} (got {choice!r})"
            )
        for key in sorted(cls.owned_init_kwargs & set(options.get("init_kwargs") or {})):
            errors.append(f"init_kwargs.{key}: set by the writer (use its own options)")
        return errors

    @classmethod
    def check_own_options(cls, options: Mapping[str, Any]) -> list[str]:
        """Problems of the subclass's own option values, ``"<option>: <what is wrong>"``
        each; :meth:`check_options` lists them after the missing library. Default: none."""
        return []

    def checkpoints_to_upload(self) -> list[Path]:
        """The files ``log_checkpoints`` names in :attr:`checkpoint_dir` (else the run's
        checkpoint folder) that are not uploaded yet: a rewritten file counts as new."""
        folder = self.checkpoint_dir or self.run_checkpoint_dir
        return checkpoint_files(folder, self.log_checkpoints, self.uploaded_checkpoints)

    def mark_uploaded(self, *paths: Path) -> None:
        """Record ``paths`` as uploaded, by their signature now: call it once the tracker
        took them, so a failed upload is tried again by the next pass."""
        self.uploaded_checkpoints += [checkpoint_signature(path) for path in paths]

    def state_dict(self) -> dict[str, Any]:
        """``{"checkpoints": [signature, ...]}``: a subclass adds its run id to it."""
        return {"checkpoints": list(self.uploaded_checkpoints)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back the uploaded files' record; a subclass calls it only for the state of
        the run it continues."""
        self.uploaded_checkpoints = [str(s) for s in state.get("checkpoints") or ()]


def checkpoint_files(folder: Path, which: str, done: Collection[str] = ()) -> list[Path]:
    """The checkpoint files a tracker uploads (``log_checkpoints``): ``best`` every
    ``best_*.pt`` of ``folder``, ``last`` the file its ``latest`` pointer names (a plain
    name of the folder only), ``none`` nothing; less those whose
    :func:`checkpoint_signature` is in ``done`` (uploaded by an earlier pass)."""
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


def _missing(library: str) -> bool:
    """True when ``library`` cannot be imported (a dotted name whose parent is missing too);
    found without importing it, so validating a config stays fast."""
    try:
        return importlib.util.find_spec(library) is None
    except (ImportError, ValueError):
        return True

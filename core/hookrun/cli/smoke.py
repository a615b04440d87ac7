"""``hookrun train CONFIG --smoke``: the config's whole path in seconds. One epoch of two
training batches and two batches of each validation and test set, with every plugin the
config selects, in a temporary work dir removed afterwards (the config's own is never
touched). The config is loaded and checked as for a run, so its mistakes are the same lines."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hookrun.distributed.cluster import env_world_size

RUNNER = {"max_epochs": 1, "max_iters": None, "limit_train_batches": 2, "limit_val_batches": 2}
"""The runner arguments ``--smoke`` replaces. The task's objects are built from the config as
it is, so what derives from the run's length (a warm-up, ``T_max: auto``) is the configured
run's: the smoke run takes its first steps."""


@contextlib.contextmanager
def temporary_work_dir(main: bool) -> Iterator[Path]:
    """A fresh folder for the run, removed (by rank 0, ``main``) at the end, however it
    ends. Under torchrun every rank names the same folder from the launch's address."""
    if env_world_size() == 1:
        folder = Path(tempfile.mkdtemp(prefix="hookrun-smoke-"))
    else:
        launch = f"{os.environ.get('MASTER_ADDR', '')}-{os.environ.get('MASTER_PORT', '')}"
        folder = Path(tempfile.gettempdir()) / f"hookrun-smoke-{launch}"
    try:
        yield folder
    finally:
        if main:
            shutil.rmtree(folder, ignore_errors=True)

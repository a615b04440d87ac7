"""Core tests run with no installed plugin unless they name one, on one intra-op thread;
``make_dist`` and the other fixtures come from ``hookrun.testing`` (hookrun's pytest plugin)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hookrun.testing import once_per_session, train_reference


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Installed plugins load only when a test names them. Tiny models train many times
    faster with one thread than with threads fighting over a shared machine's cores."""


@pytest.fixture(autouse=True)
def _python_sigint_handler() -> None:
    """Each test starts with Python's own SIGINT handler (Ctrl-C raises KeyboardInterrupt), as
    a user's interpreter does, whatever the worker process inherited or a test left."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def resume_reference(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The resume task's uninterrupted run (the checkpoint plugin keeping best_accuracy.pt
    too), trained once per session, in this process, for every worker: the reference of the
    resume and stop-signal tests (the plugin writes files but changes no compared state)."""
    plugins = {"checkpoint": {"save_best": "accuracy"}}
    return once_per_session(
        request,
        tmp_path_factory,
        "resume_reference",
        lambda folder: train_reference(folder, plugins=plugins),
    )

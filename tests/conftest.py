"""Core tests run with no installed plugin unless they name one, on one intra-op thread;
``make_dist`` and the other fixtures come from ``hookrun.testing`` (hookrun's pytest plugin)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Installed plugins load only when a test names them. Tiny models train many times
    faster with one thread than with threads fighting over a shared machine's cores."""

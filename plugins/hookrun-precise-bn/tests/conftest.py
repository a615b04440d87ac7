"""Only this plugin loads, and only when a test names it; one intra-op thread (both fixtures
from ``hookrun.testing``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None, hookrun_one_thread: None) -> None:
    """Other installed plugins stay out; each test enables precise_bn explicitly. Tiny
    models run faster and steadier with one thread than with threads fighting over cores."""

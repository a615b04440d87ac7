"""Only this plugin loads, and only when a test names it (``hookrun.testing``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(hookrun_isolated: None) -> None:
    """Other installed plugins stay out; each test enables precise_bn explicitly."""

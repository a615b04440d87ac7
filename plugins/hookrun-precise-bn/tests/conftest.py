"""Only this plugin loads, and only when a test names it."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
    monkeypatch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)

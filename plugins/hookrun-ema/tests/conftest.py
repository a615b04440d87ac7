"""Only this plugin loads, and only when a test names it; one intra-op thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
    monkeypatch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run faster, and steadier on a shared machine, with one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

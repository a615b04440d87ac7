"""Shared fixtures: core tests run with no installed plugin unless they install one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture(autouse=True)
def no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed plugins load only when a test names them."""
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
    monkeypatch.delenv("HOOKRUN_DISABLE_PLUGINS", raising=False)


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a real distribution (module + dist-info with entry points) on a temp path."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def make(dist: str, module: str, source: str, entry_points: dict[str, dict[str, str]]) -> Path:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {value}" for name, value in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        return site

    return make


def toy_data(n: int = 12, batch_size: int = 4, shuffle: bool = True, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def toy_runner_kwargs(tmp_path: Path, **overrides):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    kwargs = dict(
        model=model,
        train_dataloader=toy_data(12, 4),
        val_dataloader=toy_data(8, 4, shuffle=False, seed=1),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        max_epochs=2,
        work_dir=tmp_path / "run",
        writers=(),
    )
    kwargs.update(overrides)
    return kwargs

"""A tiny task to train in tests (data, models, runner arguments, a CLI task file) and
``hookrun`` run in the test's own process: seconds per run, no interpreter start."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy
import pytest

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from hookrun.engine.runner import Runner

_hookimpl = pluggy.HookimplMarker("hookrun")
"""The same marker as ``hookrun.hookimpl``, without importing hookrun's plugin machinery."""


def toy_data(n: int = 12, batch_size: int = 4, shuffle: bool = True, seed: int = 0) -> DataLoader:
    """``n`` samples of 4 features and a 2-class label, the same for the same ``seed``."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def toy_model(batch_norm: bool = False) -> torch.nn.Module:
    """``nn.Linear(4, 2)``, or a small MLP with a BatchNorm layer (for BN-aware plugins)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if not batch_norm:
        return nn.Linear(4, 2)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def two_loss_model() -> torch.nn.Module:
    """A classifier for ``toy_data`` whose ``training_step`` returns three loss terms,
    ``"loss"`` (back-propagated) first, then ``"ce"`` and ``"l2"``, and whose
    ``validation_step`` reports ``loss`` and ``accuracy``: for tests of what a run reports."""
    import torch
    from torch import nn

    class TwoLossModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch: Any) -> dict[str, torch.Tensor]:
            x, y = batch
            ce = nn.functional.cross_entropy(self.net(x), y)
            l2 = torch.stack([(p**2).sum() for p in self.net.parameters()]).sum() * 1e-3
            return {"loss": ce + l2, "ce": ce, "l2": l2}

        def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
            x, y = batch
            out = self.net(x)
            loss = nn.functional.cross_entropy(out, y)
            return {"loss": loss, "accuracy": (out.argmax(1) == y).float()}

    torch.manual_seed(0)
    return TwoLossModel()


class LossRecorder:
    """An ad-hoc hook keeping every iteration's raw loss terms (``after_train_iter``'s
    ``outputs``), to check what a run reports against means computed independently."""

    def __init__(self) -> None:
        self.raw: list[dict[str, torch.Tensor]] = []

    @_hookimpl
    def after_train_iter(self, outputs: dict[str, torch.Tensor]) -> None:
        self.raw.append(dict(outputs))

    def mean(self, name: str, first: int, last: int) -> float:
        """Mean of ``name`` over iterations ``first+1 .. last`` (1-based, inclusive)."""
        values = [r[name].item() for r in self.raw[max(0, first) : last]]
        return sum(values) / len(values)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The fraction of rows whose arg-max is the target."""
    return (outputs.argmax(1) == targets).float().mean()


def toy_runner_kwargs(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """Runner keyword arguments: 2 epochs x 3 batches of toy data, SGD, accuracy, no writers.

    ``overrides`` replace any of them; the optimizer follows an overridden ``model``.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = overrides["model"] if "model" in overrides else toy_model()
    kwargs: dict[str, Any] = dict(
        model=model,
        train_dataloader=toy_data(12, 4),
        val_dataloader=toy_data(8, 4, shuffle=False, seed=1),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        max_epochs=2,
        work_dir=Path(tmp_path) / "run",
        writers=(),
    )
    kwargs.update(overrides)
    return kwargs


@pytest.fixture
def make_toy_runner(tmp_path: Path) -> Callable[..., Runner]:
    """A factory: ``make_toy_runner(plugins=None, **overrides)`` is a Runner over the toy task
    working in ``tmp_path / "run"`` (see :func:`toy_runner_kwargs`)."""
    from hookrun import Runner

    def make(plugins: Mapping[str, Any] | None = None, **overrides: Any) -> Runner:
        return Runner(**toy_runner_kwargs(tmp_path, plugins=plugins, **overrides))

    return make


TOY_TASK_SOURCE = """
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import hookimpl


class Pause:
    \"\"\"Holds the run in before_train until <folder>/go exists (at most a minute).\"\"\"

    def __init__(self, folder):
        self.folder = Path(folder)

    @hookimpl
    def before_train(self, runner):
        (self.folder / "started").write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not (self.folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)


def build(n=32, width=2, optimizer=True, pause_dir=None, fail_in_forward=False):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))
    model = nn.Linear(4, width)
    if fail_in_forward:
        model.forward = explode
    objects = {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=8),
        "val_dataloader": DataLoader(data, batch_size=8),
        "test_dataloader": DataLoader(data, batch_size=8),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        "hooks": [Pause(pause_dir)] if pause_dir else [],
    }
    if optimizer:
        objects["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.1)
    return objects


def explode(x):
    raise ValueError("user code broke here")


def wrong_keys():
    return {"modle": nn.Linear(1, 1)}


def a_string_model():
    return {"model": "resnet"}
"""
"""The task file of CLI tests (``toytask.py``): ``build`` gives a linear model on 32 random
samples in batches of 8; ``width`` changes the model's shape, ``optimizer=False`` leaves the
optimizer to the config, ``pause_dir`` holds the run in ``before_train`` until
``<pause_dir>/go`` exists, ``fail_in_forward`` raises in user code. ``wrong_keys`` and
``a_string_model`` return what a task must not."""


def write_toy_task(folder: str | Path, config: str = "", name: str = "toy.yaml") -> Path:
    """Write ``toytask.py`` (:data:`TOY_TASK_SOURCE`) and a config running it into ``folder``;
    returns the config's path. ``config`` is YAML text; the default is 2 epochs on the CPU,
    the JSONL writer and only the checkpoint plugin."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toytask.py").write_text(TOY_TASK_SOURCE)
    text = config or (
        "task: toytask.py:build\n"
        "runner: {max_epochs: 2, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: true, logger: false, timer: false}\n"
    )
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``hookrun ARGS`` in this process (no interpreter start, torch already imported): the
    exit code, stdout and stderr, as a subprocess would give them."""
    from hookrun.cli.commands import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def writer_errors(spec: Any) -> list[str]:
    """Every problem ``hookrun config validate`` reports for a ``runner.writers`` spec, one
    line each: a writer's tests assert its option checks through here."""
    from hookrun.writers.registry import writer_errors as errors

    return errors(spec)

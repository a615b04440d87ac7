"""What hookrun says when something is wrong at run time. A batch or an output that does
not fit the step convention in use, met at the first iteration: one line naming the
convention and the way out, exit code 2, no traceback and no checkpoint, in every command
(train, val, test, predict); DESIGN §12, docs/training-step.md. And every hint it prints is
a command that works here, or a name that is there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _support import run, write
from hookrun.testing import run_cli, write_toy_task

TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x)


class DictOutput(Net):
    def forward(self, x):
        return {"pred": self.lin(x)}


class FirstOfInputs(Net):
    def forward(self, inputs):
        return self.lin(inputs[0])


class PerSampleLoss(Net):
    def forward(self, x, y):
        return {"loss": (self.lin(x) - y).pow(2).squeeze(1)}


def distance(outputs, targets):
    return (outputs - targets).abs().mean()


def build(kind):
    torch.manual_seed(0)
    models = {"dict_output": DictOutput, "dict_inputs": FirstOfInputs,
              "per_sample_loss": PerSampleLoss, "dict_output_metric": DictOutput}
    model = models.get(kind, Net)()
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    if kind == "dict_batch":
        data = [{"inputs": x[i:i + 4], "targets": y[i:i + 4]} for i in (0, 4)]
    elif kind == "per_sample_loss":
        data = [{"x": x[i:i + 4], "y": y[i:i + 4]} for i in (0, 4)]
    elif kind == "dict_inputs":
        data = [({"image": x[i:i + 4]}, y[i:i + 4]) for i in (0, 4)]
    else:
        data = [(x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    loader = DataLoader(data, batch_size=None)
    task = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "train_dataloader": loader, "val_dataloader": loader, "test_dataloader": loader}
    if kind in ("fits", "dict_output", "dict_inputs"):
        task["criterion"] = nn.MSELoss()
    if kind == "dict_output_metric":
        task["criterion"] = lambda out, targets: nn.functional.mse_loss(out["pred"], targets)
        task["metrics"] = {"distance": distance}
    return task
"""

CRITERION = (
    "(criterion: batches are (inputs, targets) and the loss is criterion(model(inputs), targets))"
)
OWN_LOSS = "(the model computes its loss: model(**batch) for a mapping batch, else model(batch))"

# kind: (the line's start, what it says the exception was, its end: the way out)
MISTAKES = {
    "dict_batch": (
        f"Net cannot take a dict with keys ['inputs', 'targets'] {OWN_LOSS}: TypeError: ",
        "unexpected keyword argument 'inputs'",
        "; define training_step(batch) on the model, or pass criterion=...",
    ),
    "dict_output": (
        "MSELoss cannot take DictOutput's output, a dict with keys ['pred'], and the targets, "
        f"a tensor of shape [4, 1] {CRITERION}: AttributeError: ",
        "'dict' object has no attribute 'size'",
        "; make forward return what the criterion takes, or define training_step(batch) on the "
        "model",
    ),
    "dict_inputs": (
        "FirstOfInputs cannot take the inputs, a dict with keys ['image'] ",
        f"{CRITERION}: KeyError: 0;",
        "; define training_step(batch) on the model, or drop criterion to let the model compute "
        "its loss",
    ),
    "per_sample_loss": (
        "the loss of PerSampleLoss is a tensor of shape [4]: back-propagation needs one value",
        "(a tensor of one element)",
        "; reduce it, e.g. loss.mean()",
    ),
    "dict_output_metric": (
        "metric 'distance' cannot take the outputs, a dict with keys ['pred'], and targets, a "
        "tensor of shape [4, 1]: TypeError: ",
        "unsupported operand type(s) for -: 'dict' and 'Tensor'",
        "; make metric 'distance' take them, or define validation_step(batch) on the model",
    ),
}
PREDICT = (  # the forward alone: only batches the model cannot take
    "cannot take a dict with keys",
    "to predict",
    "; define predict_step(batch) on the model",
)


def config(folder: Path, kind: str) -> Path:
    write(folder / "shapes.py", TASK)
    return write(
        folder / f"{kind}.yaml",
        f"task: shapes.py:build\ntask_args: {{kind: {kind}}}\n"
        "runner: {max_epochs: 1, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: true, logger: false}\n",
    )


@pytest.fixture
def checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A checkpoint of the same weights, trained on batches that fit."""
    folder = tmp_path / "fits"
    code, _, err = run_cli(capsys, "train", config(folder, "fits"), "--work-dir", folder / "run")
    assert code == 0, err
    return folder / "run" / "checkpoints" / "epoch_1.pt"


def assert_one_line(code: int, stderr: str, expected: tuple[str, str, str]) -> None:
    start, middle, end = expected
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(start) and middle in lines[0] and lines[0].endswith(end), lines[0]


@pytest.mark.parametrize("kind", ["dict_batch", "dict_output"])
def test_train_says_which_convention_a_batch_or_output_misses_and_saves_nothing(
    tmp_path: Path, kind: str
) -> None:
    proc: subprocess.CompletedProcess[str] = run(
        "train", config(tmp_path, kind), "--work-dir", tmp_path / "run", cwd=tmp_path
    )
    assert_one_line(proc.returncode, proc.stderr, MISTAKES[kind])
    # the checkpoint plugin is on and saves on exceptions: not for a mistake of the input
    assert not list((tmp_path / "run").rglob("*.pt"))


@pytest.mark.parametrize("kind", ["dict_inputs", "per_sample_loss"])
def test_every_convention_mistake_is_one_line_in_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    code, _, err = run_cli(capsys, "train", config(tmp_path, kind), "--work-dir", tmp_path / "run")
    assert_one_line(code, err, MISTAKES[kind])
    assert not list((tmp_path / "run").rglob("*.pt"))


@pytest.mark.parametrize(
    ("command", "kind"),
    [("val", "dict_output"), ("test", "dict_inputs"), ("val", "dict_output_metric")],
)
def test_evaluation_says_the_same_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpoint: Path, command: str, kind: str
) -> None:
    before = checkpoint.read_bytes()
    code, _, err = run_cli(
        capsys,
        command,
        config(tmp_path, kind),
        "--checkpoint",
        checkpoint,
        "--work-dir",
        tmp_path / "eval",
    )
    assert_one_line(code, err, MISTAKES[kind])
    assert checkpoint.read_bytes() == before
    assert not list((tmp_path / "eval").rglob("*.pt"))


@pytest.mark.parametrize("kind", ["dict_batch", "dict_inputs"])
def test_predict_says_which_batch_the_model_cannot_take_and_writes_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpoint: Path, kind: str
) -> None:
    output = tmp_path / "predictions.pt"
    code, _, err = run_cli(
        capsys,
        "predict",
        config(tmp_path, kind),
        "--checkpoint",
        checkpoint,
        "--output",
        output,
    )
    start, middle, end = PREDICT
    model = "Net" if kind == "dict_batch" else "FirstOfInputs"
    assert_one_line(code, err, (f"{model} {start}", middle, end))
    assert not output.exists()


# -- hints -------------------------------------------------------------------------------


def test_did_you_mean_ignores_case_and_offers_no_install_for_a_typo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_toy_task(
        tmp_path,
        "task: toytask.py:build\ntask_args: {optimizer: false}\n"
        "optimizer: {type: Adamw, lr: 0.1}\n"
        "runner: {max_epochs: 1, device: cpu}\nplugins: {chekpoint: {interval: 1}}\n",
    )
    code, out, err = run_cli(capsys, "config", "validate", config)
    assert (code, out) == (2, "")
    assert sorted(err.splitlines()) == [
        "optimizer.type: torch.optim has no class 'Adamw' (did you mean 'AdamW'?)",
        "plugins.chekpoint: unknown plugin 'chekpoint' (did you mean 'checkpoint'?)",
    ]


def test_a_plugin_of_hookrun_not_installed_names_an_install_that_works(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookrun.hooks import discovery

    real = discovery.installed
    monkeypatch.setattr(
        discovery, "installed", lambda group: {k: v for k, v in real(group).items() if k != "ema"}
    )
    code, _, err = run_cli(capsys, "plugins", "show", "ema")
    assert code == 2
    prefix = "plugins show: plugin 'ema' is not installed; pip install "
    assert err.startswith(prefix), err
    # the command as printed, run from elsewhere (a dry run: nothing changes here)
    target = err.strip().removeprefix(prefix)
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index"]
    proc = subprocess.run(
        [*pip, "--no-build-isolation", target], capture_output=True, text=True, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    assert "Would install hookrun-ema-" in proc.stdout


def test_plot_names_the_library_not_an_extra_the_index_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # Python's "not installed"
    code, out, err = run_cli(
        capsys, "schedule", write_toy_task(tmp_path), "--plot", tmp_path / "lr.png"
    )
    assert (code, out) == (2, "")
    assert err == "--plot: needs matplotlib, which is not installed; pip install matplotlib\n"
    assert not (tmp_path / "lr.png").exists()

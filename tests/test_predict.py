"""Prediction (docs/predict.md): ``runner.predict`` and ``hookrun predict`` give the model's
outputs in the loader's order, each sample once (also over 2 ranks), in eval mode without
gradients, with the predict hook points; the CLI writes one ``weights_only`` file and refuses
bad input with one line, exit code 2 and nothing written."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _support import run, write
from hookrun import ConfigError, Runner, hookimpl
from hookrun.testing import run_ranks, write_toy_task
from jobs import predict_job

JOBS = Path(__file__).parent / "jobs"


def net() -> nn.Module:
    """Batch norm with statistics of its own and dropout: eval mode changes the outputs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    model[1].running_mean.uniform_(-1, 1)
    model[1].running_var.uniform_(0.5, 2)
    return model


def data(n: int = 10) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


def by_hand(model: nn.Module, inputs: torch.Tensor, batch: int) -> torch.Tensor:
    """The model's eval-mode outputs, batch after batch in dataset order."""
    was = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(inputs[i : i + batch]) for i in range(0, len(inputs), batch)])
    model.train(was)
    return out


def test_predict_returns_the_eval_forward_in_dataset_order_and_changes_nothing(tmp_path):
    model, dataset = net(), data()
    expected = by_hand(model, dataset.tensors[0], 4)
    runner = Runner(model, criterion=nn.CrossEntropyLoss(), work_dir=tmp_path / "run", writers=())
    assert model.training
    out = runner.predict(DataLoader(dataset, batch_size=4))  # batches of 4, 4, 2
    assert torch.equal(out, expected)
    assert not out.requires_grad and out.device.type == "cpu"
    assert model.training and runner.mode == "idle"
    assert runner.last_metrics == {} and not (tmp_path / "run").exists()
    assert not torch.equal(out, model(dataset.tensors[0]).detach())  # train mode differs


class Recorder:
    """Every call of a hook point: its name, what it saw, the model's mode."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.calls, self.outputs = model, [], None

    def _log(self, *entry: Any) -> None:
        self.calls.append((*entry, self.model.training))

    @hookimpl
    def before_run(self):
        self._log("before_run")

    @hookimpl
    def before_predict(self, runner):
        self._log("before_predict", runner.mode)

    @hookimpl
    def transform_batch(self, batch, mode):
        self._log("transform_batch", mode)
        return [batch[0] * 2]  # the inputs doubled: the step predicts these

    @hookimpl
    def before_predict_iter(self, batch_idx, batch):
        self._log("before_predict_iter", batch_idx, len(batch[0]))

    @hookimpl
    def after_predict_iter(self, batch_idx, outputs):
        self._log("after_predict_iter", batch_idx, tuple(outputs.shape))

    @hookimpl
    def after_predict(self, outputs):
        self._log("after_predict")
        self.outputs = outputs

    @hookimpl
    def after_run(self):
        self._log("after_run")


def test_hook_points_fire_in_order_in_eval_mode_and_transform_batch_sees_predict(tmp_path):
    model, dataset = net(), data(5)
    hook = Recorder(model)
    runner = Runner(model, criterion=nn.CrossEntropyLoss(), hooks=[hook], work_dir=tmp_path)
    out = runner.predict(DataLoader(TensorDataset(dataset.tensors[0]), batch_size=3))
    assert hook.calls == [
        ("before_predict", "predict", False),
        ("transform_batch", "predict", False),
        ("before_predict_iter", 0, 3, False),
        ("after_predict_iter", 0, (3, 3), False),
        ("transform_batch", "predict", False),
        ("before_predict_iter", 1, 2, False),
        ("after_predict_iter", 1, (2, 3), False),
        ("after_predict", False),
    ]
    assert hook.outputs is out
    assert torch.equal(out, by_hand(model, dataset.tensors[0] * 2, 3))


class Tagger(nn.Module):
    """``predict_step`` gives per-sample tensors, a per-batch number and per-sample strings."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def predict_step(self, batch: Any) -> dict[str, Any]:
        logits = self.linear(batch[0])
        labels = ["yes" if v > 0 else "no" for v in logits[:, 0].tolist()]
        return {"logits": logits, "mean": logits.mean(), "labels": labels}


class Encoder(nn.Module):
    """A Hugging Face style model: keyword inputs, a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.linear(input_ids) * mask
        return hidden, hidden.sum(1)


def test_predict_step_outputs_are_put_together_field_by_field(tmp_path):
    torch.manual_seed(0)
    model, x = Tagger(), data(7).tensors[0]
    out = Runner(model, work_dir=tmp_path, writers=()).predict(DataLoader(TensorDataset(x), 3))
    with torch.no_grad():
        logits = torch.cat([model.linear(x[i : i + 3]) for i in (0, 3, 6)])
    assert set(out) == {"logits", "mean", "labels"}
    assert torch.equal(out["logits"], logits)
    assert out["labels"] == ["yes" if v > 0 else "no" for v in logits[:, 0].tolist()]
    assert [float(m) for m in out["mean"]] == [float(logits[i : i + 3].mean()) for i in (0, 3, 6)]


def test_a_mapping_batch_is_given_as_keywords_and_a_tuple_output_stays_a_tuple(tmp_path):
    torch.manual_seed(0)
    model, x = Encoder(), data(5).tensors[0]
    mask = (x[:, :1] > 0).float()
    batches = [{"input_ids": x[i : i + 2], "mask": mask[i : i + 2]} for i in (0, 2, 4)]
    out = Runner(model, work_dir=tmp_path, writers=()).predict(batches)
    assert isinstance(out, tuple) and len(out) == 2
    with torch.no_grad():
        hidden = torch.cat([model(**b)[0] for b in batches])
    assert torch.equal(out[0], hidden) and torch.equal(out[1], hidden.sum(1))


def test_predict_runs_under_the_runs_autocast(tmp_path):
    model, x = net(), data(4).tensors[0]
    runner = Runner(model, criterion=nn.CrossEntropyLoss(), amp="bf16", work_dir=tmp_path)
    out = runner.predict(DataLoader(TensorDataset(x), batch_size=2))
    assert out.dtype == torch.bfloat16
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.cat([model(x[:2]), model(x[2:])])
    assert torch.equal(out, expected)


def test_the_default_loader_is_predict_dataloader_else_test_dataloader(tmp_path):
    model, dataset = net(), data(6)
    predict_set = TensorDataset(dataset.tensors[0][:2])
    kwargs: dict[str, Any] = dict(criterion=nn.CrossEntropyLoss(), work_dir=tmp_path, writers=())
    test = DataLoader(dataset, batch_size=4)
    both = Runner(model, test_dataloader=test, predict_dataloader=DataLoader(predict_set), **kwargs)
    assert both.predict().shape == (2, 3)
    assert Runner(model, test_dataloader=test, **kwargs).predict().shape == (6, 3)
    with pytest.raises(ConfigError) as refused:
        Runner(model, **kwargs).predict()
    assert refused.value.lines == [
        "runner.predict: no dataloader given and no predict_dataloader or test_dataloader"
    ]


def test_two_ranks_predict_each_sample_once_and_every_rank_gets_all_in_order(tmp_path):
    run_ranks(JOBS / "predict_job.py", tmp_path, "api", path=[JOBS])
    x = predict_job.Indexed().x
    with torch.no_grad():
        expected = predict_job.Predictor().linear(x)
    for rank in (0, 1):
        out = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.equal(out["index"], torch.arange(11))
        torch.testing.assert_close(out["logits"], expected)
    # contiguous, unpadded shares: 6 and 5 samples, none predicted twice
    assert torch.load(tmp_path / "rows0.pt").tolist() == list(range(6))
    assert torch.load(tmp_path / "rows1.pt").tolist() == list(range(6, 11))


# -- hookrun predict -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The toy task trained one epoch with the checkpoint and EMA plugins: (config, checkpoint)."""
    folder = tmp_path_factory.mktemp("predict_cli")
    config = write_toy_task(
        folder,
        "task: toytask.py:build\n"
        "runner: {max_epochs: 1, device: cpu, writers: [], work_dir: run}\n"
        "plugins: {checkpoint: true, ema: {decay: 0.5}}\n",
    )
    result = run("train", config, cwd=folder, HOOKRUN_PLUGINS_AUTOLOAD="0")
    assert result.returncode == 0, result.stderr
    return config, folder / "run" / "checkpoints" / "epoch_1.pt"


def predict(*args: object, cwd: Path) -> Any:
    return run("predict", *args, cwd=cwd, HOOKRUN_PLUGINS_AUTOLOAD="0")


def toy_outputs(config: Path, weights: dict[str, torch.Tensor], loader: str) -> torch.Tensor:
    """The toy task's model with ``weights`` over its ``loader``, computed here."""
    objects = runpy.run_path(str(config.parent / "toytask.py"))["build"]()
    model = objects["model"].eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        return torch.cat([model(batch[0]) for batch in objects[loader]])


def listing(folder: Path) -> dict[Path, bytes]:
    """Every file below ``folder`` but Python's bytecode caches, with its bytes."""
    return {
        p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def test_cli_writes_the_checkpoints_outputs_and_replaces_a_file_only_with_force(trained, tmp_path):
    config, checkpoint = trained
    before, out = listing(config.parent), tmp_path / "out.pt"
    result = predict(config, "--checkpoint", checkpoint, "--output", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}: a tensor of shape [32, 2]" in result.stdout
    plain = torch.load(out, weights_only=True)
    saved = torch.load(checkpoint, weights_only=True)
    assert torch.equal(plain, toy_outputs(config, saved["model"], "test_dataloader"))
    assert listing(config.parent) == before  # the run's folder is left alone

    ema = [config, "--checkpoint", checkpoint, "--output", out, "--ema"]
    result = predict(*ema, cwd=tmp_path)
    assert (result.returncode, result.stderr.splitlines()) == (
        2,
        [f"--output: {out} exists; pass --force to replace it"],
    )
    assert torch.equal(torch.load(out, weights_only=True), plain)  # left as it was
    result = predict(*ema, "--force", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    average = torch.load(out, weights_only=True)
    expected = toy_outputs(config, saved["plugins"]["ema"]["model"], "test_dataloader")
    assert torch.equal(average, expected)
    assert not torch.equal(average, plain)


def test_cli_predicts_over_the_tasks_predict_dataloader(trained, tmp_path):
    config, checkpoint = trained
    write(
        config.parent / "predtask.py",
        """
        from torch.utils.data import DataLoader, TensorDataset
        from toytask import build as toy

        def build():
            objects = toy()
            inputs = objects["test_dataloader"].dataset.tensors[0][:5]
            objects["predict_dataloader"] = DataLoader(TensorDataset(inputs), batch_size=2)
            return objects
        """,
    )
    other = write(
        config.parent / "pred.yaml", config.read_text().replace("toytask.py", "predtask.py")
    )
    out = tmp_path / "out.pt"
    result = predict(other, "--checkpoint", checkpoint, "--output", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = torch.load(checkpoint, weights_only=True)["model"]
    expected = toy_outputs(config, saved, "test_dataloader")[:5]
    torch.testing.assert_close(torch.load(out, weights_only=True), expected)


def test_cli_on_two_ranks_writes_the_outputs_in_dataset_order(trained, tmp_path):
    config, checkpoint = trained
    out = tmp_path / "out.pt"
    args = ["predict", config, "--checkpoint", checkpoint, "--output", out]
    run_ranks(JOBS / "predict_job.py", tmp_path, "cli", *args, path=[JOBS])
    saved = torch.load(checkpoint, weights_only=True)["model"]
    expected = toy_outputs(config, saved, "test_dataloader")
    torch.testing.assert_close(torch.load(out, weights_only=True), expected)


@pytest.mark.parametrize(
    "case", ["missing checkpoint", "missing folder", "no loader", "no ema", "other model"]
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(trained, tmp_path, case):
    config, checkpoint = trained
    args: list[object] = [config, "--checkpoint", checkpoint, "--output", tmp_path / "out.pt"]
    if case == "missing checkpoint":
        args[2] = tmp_path / "missing.pt"
        line = f"--checkpoint: file not found: {tmp_path / 'missing.pt'}"
    elif case == "missing folder":
        args[4] = tmp_path / "nope" / "out.pt"
        line = f"--output: folder {tmp_path / 'nope'} does not exist; create it first"
    elif case == "no loader":
        write(tmp_path / "bare.py", "from toytask import build as toy\n\n\ndef build():\n"
              "    return {'model': toy()['model']}\n")  # fmt: skip
        args[0] = write(tmp_path / "bare.yaml", "task: bare.py:build\nrunner: {device: cpu}\n")
        (tmp_path / "toytask.py").write_text((config.parent / "toytask.py").read_text())
        line = "task: bare.py:build returned no predict_dataloader and no test_dataloader"
    elif case == "no ema":
        state = torch.load(checkpoint, weights_only=True)
        del state["plugins"]["ema"]
        torch.save(state, tmp_path / "plain.pt")
        args[2] = tmp_path / "plain.pt"
        args.append("--ema")
        plain = tmp_path / "plain.pt"
        line = f"--ema: checkpoint {plain} holds no EMA weights (the ema plugin was not on)"
    else:
        args += ["--set", "task_args.width=3"]
        line = None
    before = listing(tmp_path)
    result = predict(*args, cwd=tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    if line is not None:
        assert lines == [line]
    else:
        assert lines[0].startswith(f"checkpoint {checkpoint} does not fit"), lines
    assert listing(tmp_path) == before

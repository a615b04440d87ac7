"""What a run shows at its start and keeps for TensorBoard: the model summary line (rank 0),
the config's hyper-parameters in the HParams tab with the final metrics, and histograms a
plugin writes through ``Writer.write_histogram``. The event file is read back with
TensorBoard's own ``EventAccumulator``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _support import run, write

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2  # noqa: E402

TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader

from hookrun import hookimpl


class Histograms:
    @hookimpl
    def after_train_epoch(self, runner):
        for writer in runner.writers:
            writer.write_histogram("weights/head", runner.unwrapped_model[3].weight, runner.iter)


def build(lr):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.BatchNorm1d(1024), nn.ReLU(), nn.Linear(1024, 2))
    model[0].requires_grad_(False)
    x, y = torch.randn(32, 256), torch.randint(0, 2, (32,))
    loader = DataLoader(list(zip(x, y)), batch_size=8)
    head = [p for p in model.parameters() if p.requires_grad]
    return {"model": model, "optimizer": torch.optim.SGD(head, lr=lr),
            "train_dataloader": loader, "val_dataloader": loader,
            "criterion": nn.CrossEntropyLoss(), "hooks": [Histograms()]}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One CLI run of two epochs with TensorBoard and JSONL: its work dir and stdout."""
    folder = tmp_path_factory.mktemp("start")
    write(folder / "task.py", TASK)
    config = write(
        folder / "run.yaml",
        "task: task.py:build\ntask_args: {lr: 0.05}\n"
        "runner: {max_epochs: 2, device: cpu, seed: 3, writers: [tensorboard, jsonl]}\n"
        "plugins: {checkpoint: {interval: 1}, logger: false}\n",
    )
    proc = run("train", config, "--work-dir", folder / "run", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder / "run", proc.stdout


def events(work_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(work_dir / "tensorboard"), size_guidance={"histograms": 0})
    accumulator.Reload()
    return accumulator


def test_the_model_summary_line_counts_parameters_trainable_and_size(
    trained: tuple[Path, str],
) -> None:
    _, stdout = trained
    frozen = 256 * 1024 + 1024  # the first Linear
    trainable = 2 * 1024 + (1024 * 2 + 2)  # BatchNorm's weight and bias, the head
    buffers = 2 * 1024 * 4 + 8  # running mean and variance (float32), the batch count (int64)
    mib = ((frozen + trainable) * 4 + buffers) / 2**20
    line = (
        f"[hookrun] model Sequential: {frozen + trainable:,} parameters ({trainable:,} "
        f"trainable), {mib:.2f} MiB"
    )
    assert line in stdout.splitlines(), stdout


def test_hparams_hold_the_config_and_the_final_metrics(trained: tuple[Path, str]) -> None:
    work_dir, _ = trained
    accumulator = events(work_dir)
    contents = accumulator.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        contents["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["task_args.lr"].number_value == 0.05
    assert start.hparams["runner.max_epochs"].number_value == 2
    assert start.hparams["runner.seed"].number_value == 3
    assert start.hparams["task"].string_value == f"{work_dir.parent / 'task.py'}:build"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        contents["_hparams_/experiment"]
    ).experiment
    metrics = {info.name.tag for info in experiment.metric_infos}
    assert "val/loss" in metrics
    end = plugin_data_pb2.HParamsPluginData.FromString(
        contents["_hparams_/session_end_info"]
    ).session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS
    # each metric's final value, as TensorBoard shows it beside the hyper-parameters, is the
    # last one the JSONL log holds
    records = [json.loads(line) for line in (work_dir / "log.jsonl").read_text().splitlines()]
    for tag in metrics:
        logged = [r[tag] for r in records if tag in r]
        assert accumulator.Scalars(tag)[-1].value == pytest.approx(logged[-1], rel=1e-6)


def test_a_histogram_a_plugin_writes_is_in_the_event_file(trained: tuple[Path, str]) -> None:
    work_dir, _ = trained
    histograms = events(work_dir).Histograms("weights/head")
    assert [h.step for h in histograms] == [4, 8]  # after each epoch of 4 iterations
    weight = torch.load(work_dir / "checkpoints" / "epoch_2.pt", weights_only=True)["model"][
        "3.weight"
    ].double()
    last = histograms[-1].histogram_value
    assert last.num == weight.numel() == 2048
    assert last.min == pytest.approx(weight.min().item())
    assert last.max == pytest.approx(weight.max().item())
    assert last.sum == pytest.approx(weight.sum().item(), abs=1e-9)
    assert sum(last.bucket) == 2048

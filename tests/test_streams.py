"""Streams and stateful loaders (docs/data.md): a train loader without ``__len__`` trains in
``max_iters`` and epoch runs as a hand-written loop over the same stream does; a loader with
its own ``state_dict`` (torchdata's ``StatefulDataLoader``) SIGKILLed mid-epoch resumes bit
for bit, in one process and on 2 torchrun ranks; a stream without state restarts its epoch
with a notice. The jobs: jobs/stream_job.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from hookrun import ConfigError, Runner, already_sharded, hookimpl
from hookrun.data.sharding import train_sampler
from hookrun.testing import assert_same_checkpoint, forked, load_checkpoint, run_job
from jobs.stream_job import EPOCHS

JOB = Path(__file__).parent / "jobs" / "stream_job.py"


class Stream(IterableDataset):
    """``n`` samples in a fixed order, without ``__len__``."""

    def __init__(self, n: int, seed: int = 5) -> None:
        self.n, self.seed = n, seed

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(self.seed)
        for _ in range(self.n):
            x = torch.randn(4, generator=g)
            yield x, (x[0] + x[1] > 0).long()


class Recorder:
    """Every hook point of a training run, in order, with the loss of each iteration and
    what the runner says of the run's length as each epoch starts."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.losses: list[torch.Tensor] = []
        self.lengths: list[int | None] = []
        self.with_eta: list[int] = []  # the reports that carried an ETA

    @hookimpl
    def before_train_epoch(self, runner: Any) -> None:
        self.calls.append("before_train_epoch")
        self.lengths.append(runner.max_iters)

    @hookimpl
    def after_train_epoch(self) -> None:
        self.calls.append("after_train_epoch")

    @hookimpl
    def before_train_iter(self, batch_idx: int) -> None:
        self.calls.append(f"before_train_iter {batch_idx}")

    @hookimpl
    def after_train_iter(self, batch_idx: int, outputs: dict[str, torch.Tensor]) -> None:
        self.calls.append(f"after_train_iter {batch_idx}")
        self.losses.append(outputs["loss"])

    @hookimpl
    def before_optimizer_step(self) -> None:
        self.calls.append("step")

    @hookimpl
    def after_report(self, scalars: dict[str, float], step: int) -> None:
        if "train/eta" in scalars:
            self.with_eta.append(step)

    @hookimpl
    def before_val(self) -> None:
        self.calls.append("before_val")

    @hookimpl
    def after_val_epoch(self, metrics: dict[str, float]) -> None:
        self.calls.append("after_val_epoch")


def hand_loop(batches: int, per_epoch: int, accum: int) -> tuple[list[float], nn.Module]:
    """The same training written by hand: ``batches`` batches of 3 over ``Stream(10)``, epoch
    after epoch, the loss divided by ``accum``, a step every ``accum`` batches of an epoch and
    at its last."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses: list[float] = []
    while len(losses) < batches:
        for index, (x, y) in enumerate(DataLoader(Stream(10), batch_size=3)):
            loss = nn.functional.cross_entropy(model(x), y)
            losses.append(loss.item())
            (loss / accum).backward()
            if (index + 1) % accum == 0 or index + 1 == per_epoch:
                opt.step()
                opt.zero_grad()
            if len(losses) == batches:
                break
    return losses, model


def stream_runner(tmp_path: Path, recorder: Recorder, **options: Any) -> Runner:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return Runner(
        model,
        train_dataloader=DataLoader(Stream(10), batch_size=3),
        val_dataloader=DataLoader(Stream(4, seed=9), batch_size=2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        work_dir=tmp_path / "run",
        writers=("jsonl",),
        plugins={},
        hooks=[recorder],
        log_interval=1,
        **options,
    )


def test_a_max_iters_run_over_a_stream_trains_as_a_hand_loop(tmp_path: Path) -> None:
    """7 iterations over a stream of 4 batches an epoch: the second epoch is cut at its third
    batch; the losses and weights equal the hand loop's."""
    recorder = Recorder()
    runner = stream_runner(tmp_path, recorder, max_iters=7, val_interval=100)
    runner.train()
    expected, model = hand_loop(7, per_epoch=4, accum=1)
    assert [loss.item() for loss in recorder.losses] == expected
    assert torch.equal(runner.model.weight, model.weight)
    assert torch.equal(runner.model.bias, model.bias)
    assert runner.position.iter == 7 and runner.position.epoch == 1


def test_a_two_epoch_run_over_a_stream_calls_the_hooks_in_order(tmp_path: Path) -> None:
    """2 epochs of a stream of 4 batches, accumulating 3: an epoch ends when the iterator
    does, its short last group steps then (after its last iteration, before
    ``after_train_epoch``), validation follows each epoch; the run's length is unknown until
    the first epoch ended, and so is the ETA."""
    recorder = Recorder()
    runner = stream_runner(tmp_path, recorder, max_epochs=2, grad_accum=3)
    runner.train()
    epoch = ["before_train_epoch"]
    for i in range(4):
        epoch += [f"before_train_iter {i}", *(["step"] if i == 2 else []), f"after_train_iter {i}"]
    epoch += ["step", "after_train_epoch", "before_val", "after_val_epoch"]
    assert recorder.calls == epoch + epoch
    expected, model = hand_loop(8, per_epoch=4, accum=3)
    assert [loss.item() for loss in recorder.losses] == expected
    assert torch.equal(runner.model.weight, model.weight)
    assert recorder.lengths == [None, 8]
    assert runner.position.optimizer_steps == {"main": 4}
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").open()]
    reported = [row["step"] for row in rows if "train/loss" in row]
    assert reported == list(range(1, 9))
    with_eta = recorder.with_eta  # estimates only once the first epoch's length is known
    assert with_eta and min(with_eta) > 4


def test_schedule_auto_over_a_stream_asks_for_numbers(tmp_path: Path) -> None:
    """``T_max: auto`` needs the epoch's length, which a stream has not: one line, exit 2,
    nothing written."""
    task = tmp_path / "task.py"
    task.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader\n"
        "from test_streams_task import Stream\n"
    )
    (tmp_path / "test_streams_task.py").write_text(
        "import torch\nfrom torch.utils.data import IterableDataset\n"
        "class Stream(IterableDataset):\n"
        "    def __iter__(self):\n"
        "        for _ in range(6):\n"
        "            yield torch.randn(4), torch.tensor(0)\n"
    )
    task.write_text(
        task.read_text() + "def build():\n"
        "    model = nn.Linear(4, 2)\n"
        "    return {'model': model, 'train_dataloader': DataLoader(Stream(), batch_size=2),\n"
        "            'criterion': nn.CrossEntropyLoss()}\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "task: task.py:build\n"
        f"runner: {{max_epochs: 2, work_dir: {tmp_path / 'run'}, scheduler_interval: iter}}\n"
        "optimizer: {type: SGD, lr: 0.1}\n"
        "scheduler: {main: {type: CosineAnnealingLR, T_max: auto}}\n"
    )
    proc = run_job(["-m", "hookrun", "train", config], expect=2, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "`auto` needs the length" in lines[0] and "as numbers" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's, under torch 2.13
def test_a_stateful_loader_under_ddp_must_be_sharded_by_its_user() -> None:
    """hookrun does not rebuild a loader that resumes by its own state: under
    torch.distributed one without a ``DistributedSampler`` or the already-sharded mark is
    one line naming the way out; with either, or in one process, it is used as it is."""
    data = TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    loader = StatefulDataLoader(data, batch_size=2, shuffle=True)
    with pytest.raises(ConfigError) as caught:
        train_sampler(loader, "train_dataloader", 0, 1, 2)
    message = str(caught.value)
    assert message.startswith("train_dataloader: a StatefulDataLoader, which resumes"), message
    assert "DistributedSampler" in message and "hookrun.already_sharded(loader)" in message
    assert "\n" not in message
    assert train_sampler(loader, "train_dataloader", 0, 0, 1) is None
    assert train_sampler(already_sharded(loader), "train_dataloader", 0, 1, 2) is None
    own = StatefulDataLoader(data, batch_size=2, sampler=DistributedSampler(data, 2, 1))
    assert train_sampler(own, "train_dataloader", 0, 1, 2) is None


def job(work_dir: Path, kind: str, *args: str, expect: int = 0) -> str:
    """jobs/stream_job.py in one fresh process; its output."""
    proc = run_job([JOB, work_dir, "--kind", kind, *args], expect=expect)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(("kind", "kill_at"), [("map", 11), ("iterable", 11), ("iterable", 9)])
def test_a_stateful_loader_killed_mid_epoch_resumes_exactly(
    tmp_path: Path, kind: str, kill_at: int
) -> None:
    """SIGKILLed as iteration 11 starts (the second batch of epoch 2, 9 batches an epoch;
    the newest checkpoint holds one batch of it), or 9 (the epoch's first: the newest
    checkpoint is epoch 1's end), then ``--resume auto``: the same weights and optimizer
    state, bit for bit, as the run never interrupted. The checkpoint holds the loader's own
    state."""
    job(tmp_path / "reference", kind)
    crashed = tmp_path / "crashed"
    job(crashed, kind, "--kill-at", str(kill_at), expect=-signal.SIGKILL)
    output = job(crashed, kind, "--resume")
    newest = "iter_10.pt" if kill_at == 11 else "epoch_1.pt"
    assert f"resumed from {crashed / 'checkpoints' / newest}" in output, output
    assert "starts again" not in output
    assert_same_checkpoint(tmp_path / "reference" / "final.pt", crashed / "final.pt")
    saved = load_checkpoint(crashed / "checkpoints" / newest)
    assert isinstance(saved["loader"], list) and len(saved["loader"]) == 1


def test_a_stream_without_state_restarts_its_epoch_with_a_notice(tmp_path: Path) -> None:
    """A ``DataLoader`` over a stream that keeps no state, killed one batch into epoch 2:
    the resume says, in one line, that the epoch starts again, trains its 9 batches from
    the first, and ends the 3 epochs one iteration later than the run never interrupted."""
    crashed = tmp_path / "crashed"
    job(crashed, "plain", "--kill-at", "11", expect=-signal.SIGKILL)
    output = job(crashed, "plain", "--resume")
    notices = [line for line in output.splitlines() if "cannot continue mid-epoch" in line]
    assert notices == [
        "[hookrun] train_dataloader: a stream without state_dict() cannot continue mid-epoch; "
        "epoch 2 starts again from its first batch (1 batches are trained again)"
    ], output
    final = load_checkpoint(crashed / "final.pt")["loop"]
    assert (final["epoch"], final["iter"]) == (EPOCHS, EPOCHS * 9 + 1), final


def torchrun(work_dir: Path, kind: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(JOB), str(work_dir), "--kind", kind, *args]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    return forked.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_a_stateful_loader_on_two_ranks_resumes_exactly(tmp_path: Path, kind: str) -> None:
    """2 torchrun ranks, each with its share (a ``DistributedSampler``; a stream declared
    already sharded), both SIGKILLed as iteration 7 starts (the second batch of epoch 2):
    the resume continues each rank's loader from its own saved state and ends bit identical
    to the run never interrupted."""
    reference = torchrun(tmp_path / "reference", kind)
    assert reference.returncode == 0, reference.stderr[-3000:]
    crashed = tmp_path / "crashed"
    assert torchrun(crashed, kind, "--kill-at", "7").returncode != 0
    assert not (crashed / "final.pt").exists()
    proc = torchrun(crashed, kind, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout and "iter_6.pt" in proc.stdout, proc.stdout
    assert_same_checkpoint(tmp_path / "reference" / "final.pt", crashed / "final.pt")
    ranks = load_checkpoint(crashed / "checkpoints" / "iter_6.pt")["loader"]
    assert len(ranks) == 2 and all(rank["_num_yielded"] == 1 for rank in ranks), ranks

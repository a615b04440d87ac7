"""torch.distributed with real processes: torchrun, gloo, two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_job import data, model
from test_resume import assert_identical
from torch import nn

from hookrun import Runner

JOB = Path(__file__).with_name("dist_job.py")


def torchrun(
    work_dir: Path, *args: str, timeout: float = 240, new_session: bool = False
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(JOB),
        str(work_dir),
        *args,
    ]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=new_session,
    )


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("ddp")
    proc = torchrun(work_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work_dir


def test_two_ranks_end_with_identical_weights_and_metrics(two_rank_run):
    rank0 = torch.load(two_rank_run / "rank0.pt", weights_only=True)
    rank1 = torch.load(two_rank_run / "rank1.pt", weights_only=True)
    assert rank0["world_size"] == 2
    for name, tensor in rank0["weights"].items():
        assert torch.equal(tensor, rank1["weights"][name]), name
    assert rank0["metrics"] == rank1["metrics"]


def test_metrics_equal_a_single_process_evaluation(two_rank_run, tmp_path):
    rank0 = torch.load(two_rank_run / "rank0.pt", weights_only=True)
    net = model()
    net.load_state_dict(rank0["weights"])
    runner = Runner(
        net,
        val_dataloader=data(13, 2, shuffle=False),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        writers=(),
        work_dir=tmp_path,
    )
    single = runner.val()
    assert single.keys() == rank0["metrics"].keys()
    for key, value in single.items():
        assert rank0["metrics"][key] == pytest.approx(value, rel=1e-6)


def test_one_set_of_checkpoints_and_one_event_file(two_rank_run):
    names = sorted(p.name for p in (two_rank_run / "checkpoints").iterdir())
    # 48 samples over 2 ranks in batches of 4: 6 iterations per epoch, 18 in all
    assert names == [f"iter_{n}.pt" for n in (12, 15, 18, 3, 6, 9)]
    assert len(list((two_rank_run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    final = torch.load(two_rank_run / "final.pt", weights_only=True)
    assert final["meta"]["world_size"] == 2 and len(final["rng_ranks"]) == 2


def test_sigkill_both_ranks_then_resume_is_bit_identical(two_rank_run, tmp_path):
    crashed = tmp_path / "crashed"
    proc = torchrun(crashed, "--kill-at", "7")  # mid-epoch 1, after the iter_6 checkpoint
    assert proc.returncode != 0
    assert not (crashed / "final.pt").exists()
    proc = torchrun(crashed, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_identical(two_rank_run / "final.pt", crashed / "final.pt")


def test_sigterm_on_one_rank_stops_both_at_one_iteration_and_resumes_exactly(
    two_rank_run, tmp_path
):
    stopped = tmp_path / "stopped"
    proc = torchrun(stopped, "--with-checkpoint", "--term-at", "7")  # rank 1 only
    assert proc.returncode != 0  # both ranks end by the signal, as it asks
    assert proc.stdout.count("SIGTERM received") == 1  # rank 0 reports for both
    saved = (stopped / "checkpoints" / "latest").read_text().strip()
    assert saved.startswith("iter_") and 8 <= int(saved[5:-3]) < 18
    assert not (stopped / "final.pt").exists()
    proc = torchrun(stopped, "--with-checkpoint", "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_identical(two_rank_run / "final.pt", stopped / "final.pt")


def test_group_sigterm_with_loader_workers_under_torchrun_saves_and_resumes_exactly(
    two_rank_run, tmp_path
):
    """A scheduler signals the whole process group: the agent, both ranks, their workers."""
    stopped = tmp_path / "stopped"
    start = time.monotonic()
    args = ("--with-checkpoint", "--workers", "2")
    proc = torchrun(stopped, *args, "--group-term-at", "7", new_session=True)
    assert time.monotonic() - start < 60  # not torchrun's 30 s grace on top
    assert proc.returncode != 0
    assert "killed by signal" not in proc.stderr
    assert proc.stdout.count("SIGTERM received") == 1
    saved = (stopped / "checkpoints" / "latest").read_text().strip()
    assert saved.startswith("iter_") and 8 <= int(saved[5:-3]) < 18
    proc = torchrun(stopped, *args, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_identical(two_rank_run / "final.pt", stopped / "final.pt")


def test_exception_on_one_rank_ends_both(tmp_path):
    start = time.monotonic()
    proc = torchrun(tmp_path, "--fail-at", "4", timeout=180)
    assert time.monotonic() - start < 30  # start-up included; not torchrun's 30 s grace
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stdout + proc.stderr
    assert (tmp_path / "on_exception_rank1.txt").exists()
    assert not (tmp_path / "final.pt").exists()


def test_timer_and_logger_report_from_rank_0_with_the_slowest_data_time(tmp_path):
    proc = torchrun(tmp_path, "--with-plugins", "--slow-rank1-data", "0.03")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == [6, 12, 18]  # one writer: rank 0's
    # rank 1 waits 30 ms for each batch, rank 0 does not: the report shows rank 1's wait
    assert all(line["train/data_time_max"] >= 0.03 for line in train), train
    assert all(line["train/data_time"] < line["train/data_time_max"] for line in train), train
    assert proc.stdout.count("Overall training speed") == 1

"""torch.distributed with real processes: torchrun and SLURM-style tasks, gloo, 1 to 3 ranks.
Every launch is bounded by a timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from hookrun import Runner
from hookrun.testing import assert_same_checkpoint, forked, isolated_env, once_per_session
from jobs import dist_job
from jobs.dist_job import data, model

JOB = Path(__file__).parent / "jobs" / "dist_job.py"


def torchrun(
    work_dir: Path,
    *args: str,
    timeout: float = 240,
    new_session: bool = False,
    nproc: int = 2,
    restarts: int = 0,
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={restarts}",
        str(JOB),
        str(work_dir),
        *args,
    ]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    return forked.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=new_session,
    )


@pytest.fixture
def two_rank_run(request, tmp_path_factory):
    """An uninterrupted 2-rank run, launched once per session for every xdist worker."""

    def launch(work_dir: Path) -> None:
        proc = torchrun(work_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]

    return once_per_session(request, tmp_path_factory, "ddp_two_rank_run", launch)


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


def test_sigterm_on_one_rank_stops_both_at_one_iteration_and_resumes_exactly(
    two_rank_run, tmp_path
):
    stopped = tmp_path / "stopped"
    proc = torchrun(stopped, "--with-checkpoint", "--term-at", "7")  # rank 1 only
    assert proc.returncode != 0  # both ranks end by the signal, as it asks
    assert proc.stderr.count("SIGTERM received") == 1  # rank 0 reports for both
    saved = (stopped / "checkpoints" / "latest").read_text().strip()
    assert saved.startswith("iter_") and 8 <= int(saved[5:-3]) < 18
    assert not (stopped / "final.pt").exists()
    proc = torchrun(stopped, "--with-checkpoint", "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_checkpoint(two_rank_run / "final.pt", stopped / "final.pt")


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
    assert proc.stderr.count("SIGTERM received") == 1
    saved = (stopped / "checkpoints" / "latest").read_text().strip()
    assert saved.startswith("iter_") and 8 <= int(saved[5:-3]) < 18
    proc = torchrun(stopped, *args, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_checkpoint(two_rank_run / "final.pt", stopped / "final.pt")


@pytest.mark.timing
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


# -- clusters (issue 18) ---------------------------------------------------------------------


def slurm_tasks(
    commands: list[list[str]], timeout: float = 120, cwd: Path | None = None
) -> tuple[list[subprocess.CompletedProcess], float]:
    """Start one process per command with the variables ``srun`` sets for a task (no
    torchrun); the port is given as a user would override it. Returns their results, in rank
    order, and the seconds until the last one ended; all are killed at ``timeout``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    procs = []
    for rank, command in enumerate(commands):
        env = isolated_env({**os.environ, "OMP_NUM_THREADS": "1"})
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(len(commands)),
            SLURM_LOCALID=str(rank),
            SLURM_JOB_ID="4242",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=str(port),
        )
        procs.append(
            forked.spawn(
                [sys.executable, *command],
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            out, err = proc.communicate(timeout=left)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results, time.monotonic() - start


def seen(work_dir: Path, rank: int) -> dict:
    return json.loads((work_dir / f"seen_rank{rank}.json").read_text())


def test_slurm_tasks_form_one_job_and_a_subset_sampler_split_stays_split(tmp_path):
    """Two processes with SLURM's variables form one 2-rank job; a SubsetRandomSampler
    train/val split trains and validates on the same indices as one process does."""
    job = tmp_path / "slurm"
    results, _ = slurm_tasks([[str(JOB), str(job), "--subset"]] * 2)
    for proc in results:
        assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = torch.load(job / "rank0.pt", weights_only=True)
    rank1 = torch.load(job / "rank1.pt", weights_only=True)
    assert rank0["world_size"] == rank1["world_size"] == 2
    for name, tensor in rank0["weights"].items():
        assert torch.equal(tensor, rank1["weights"][name]), name
    assert len(list((job / "tensorboard").glob("events.out.tfevents.*"))) == 1

    single = tmp_path / "single"
    threads = torch.get_num_threads()
    try:
        dist_job.main([str(single), "--subset"])
    finally:
        torch.set_num_threads(threads)
    alone, ranks = seen(single, 0), [seen(job, 0), seen(job, 1)]
    assert sorted(alone["train"]) == ["0", "1", "2"]
    for epoch, order in alone["train"].items():
        assert sorted(order) == dist_job.TRAIN_SPLIT  # each training sample once per epoch
        # the same epoch order as one process, dealt out in turn
        assert ranks[0]["train"][epoch] == order[0::2]
        assert ranks[1]["train"][epoch] == order[1::2]
    assert sorted(alone["val"]) == dist_job.VAL_SPLIT
    assert sorted(ranks[0]["val"] + ranks[1]["val"]) == dist_job.VAL_SPLIT

    # the 2-rank metrics are those of one process evaluating the validation split
    net = model()
    net.load_state_dict(rank0["weights"])
    runner = Runner(
        net,
        val_dataloader=dist_job.split_data()[1],
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        writers=(),
        work_dir=tmp_path / "eval",
    )
    expected = runner.val()
    for key, value in expected.items():
        assert rank0["metrics"][key] == pytest.approx(value, rel=1e-6)


def test_a_killed_job_resumes_and_a_torchrun_restart_after_a_killed_rank_too(
    two_rank_run, tmp_path
):
    """Both ranks SIGKILLed at iteration 7 (mid-epoch 1, after iter_6.pt); the next launch,
    ``torchrun --max-restarts=1 ... --resume``, resumes from iter_6.pt, and its rank 1 is
    SIGKILLed at iteration 10 in the first attempt: the second attempt forms a new group,
    resumes from iter_9.pt and ends bit identical to the uninterrupted run.
    ``python tests/jobs/dist_restarts.py`` repeats a restart 5 times and prints how many succeed."""
    work = tmp_path / "crashed"
    proc = torchrun(work, "--kill-at", "7")
    assert proc.returncode != 0
    assert not (work / "final.pt").exists()
    proc = torchrun(work, "--resume", "--first-attempt-kill-at", "10", restarts=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = [line for line in proc.stdout.splitlines() if "resumed from" in line]
    assert len(resumed) == 2, proc.stdout  # rank 0 reports, once per attempt
    assert "iter_6.pt" in resumed[0] and "iter_9.pt" in resumed[1], resumed
    assert_same_checkpoint(two_rank_run / "final.pt", work / "final.pt")


def test_a_two_rank_checkpoint_continues_on_one_and_on_three_ranks(two_rank_run, tmp_path):
    """iter_9.pt was saved after 3 of the 6 batches of epoch 1 on 2 ranks: the samples of
    that epoch the uninterrupted run used afterwards are each seen exactly once on 1 and on
    3 ranks, and the next epoch sees every sample once."""
    left = sorted(
        seen(two_rank_run, 0)["train"]["1"][12:] + seen(two_rank_run, 1)["train"]["1"][12:]
    )
    assert len(left) == 24
    checkpoint = two_rank_run / "checkpoints" / "iter_9.pt"

    three = tmp_path / "three"
    proc = torchrun(three, "--resume-from", str(checkpoint), nproc=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the global batch changes from 8 to 12; epoch 2 continues after 24 of" in proc.stdout
    ranks = [seen(three, r)["train"] for r in range(3)]
    assert sorted(sum((r["1"] for r in ranks), [])) == left
    assert sorted(sum((r["2"] for r in ranks), [])) == list(range(48))
    # the run's last iteration is known as such (a final checkpoint is saved there): 9 done,
    # 24 samples left of epoch 2 in 2 iterations of 12, then 4 of epoch 3
    assert seen(two_rank_run, 0)["last_iter"] == [17]
    assert [seen(three, r)["last_iter"] for r in range(3)] == [[14]] * 3

    one = tmp_path / "one"
    threads = torch.get_num_threads()
    try:
        dist_job.main([str(one), "--resume-from", str(checkpoint)])
    finally:
        torch.set_num_threads(threads)
    alone = seen(one, 0)["train"]
    assert sorted(alone["1"]) == left
    assert sorted(alone["2"]) == list(range(48))
    assert seen(one, 0)["last_iter"] == [26]  # 9, then 6 iterations of 4 and 12


@pytest.mark.timing
def test_a_hung_rank_ends_the_job_within_dist_timeout(tmp_path):
    """Rank 1 sleeps in a hook: rank 0's collective fails after ``dist_timeout``; the hung
    rank, given torchrun's SIGTERM, ends once it made no progress for ``dist_timeout``."""
    start = time.monotonic()
    proc = torchrun(tmp_path, "--hang-at", "4", "--dist-timeout", "6", timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    # start-up, 6 s for rank 0's collective and 6 s for the hung rank's watchdog, and not
    # torchrun's 30 s grace on top
    assert elapsed < 40, elapsed
    # rank 0's collective, bounded by dist_timeout: gloo reports it from the receive that
    # timed out or, when the pair's own timeout fires first, as the pair's closure
    timeouts = ("Timed out waiting 6000ms", "Application timeout caused pair closure")
    assert any(text in proc.stderr for text in timeouts), proc.stderr[-3000:]
    assert not (tmp_path / "final.pt").exists()


@pytest.mark.timing
def test_a_rank_busy_in_host_code_ends_soon_after_its_peer_died(tmp_path):
    """Rank 1 is SIGKILLed while rank 0 spins in a hook (no collective to fail): torchrun
    sends rank 0 SIGTERM, and rank 0, seeing rank 1 gone, ends by it at once, not after
    ``dist_timeout`` (600 s here) nor at torchrun's SIGKILL 30 s later."""
    proc = torchrun(tmp_path, "--busy-at", "4", timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    elapsed = ended - float((tmp_path / "rank1_killed").read_text())
    assert elapsed < 20, elapsed
    line = "[rank 0] hookrun: SIGTERM received, rank 1 has ended: ending without a checkpoint"
    assert line in proc.stderr.splitlines(), proc.stderr[-3000:]
    assert "exitcode  : 143" in proc.stderr  # rank 0 ended by the signal, not by SIGKILL


TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

def build():
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    model = nn.Linear(4, 2)
    return {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=4),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": nn.CrossEntropyLoss(),
    }
"""


def test_a_missing_resume_path_on_rank_1_ends_every_rank_with_exit_2(tmp_path):
    (tmp_path / "task.py").write_text(TASK)
    config = tmp_path / "run.yaml"
    config.write_text("task: task.py:build\nrunner: {max_epochs: 1, writers: []}\n")
    work = tmp_path / "work"
    common = ["-m", "hookrun", "train", str(config), "--work-dir", str(work)]
    missing = tmp_path / "nope.pt"
    results, elapsed = slurm_tasks(
        [[*common, "--resume", "auto"], [*common, "--resume", str(missing)]], timeout=90
    )
    assert [proc.returncode for proc in results] == [2, 2], [p.stderr for p in results]
    assert elapsed < 60
    assert results[1].stderr.strip() == f"[rank 1] --resume: file not found: {missing}"
    assert results[0].stderr.strip() == (
        f"[rank 0] stopped: rank 1 failed: --resume: file not found: {missing}"
    )
    assert not work.exists()


def test_a_save_inside_an_accumulation_group_resumes_under_ddp(tmp_path):
    """The ranks' partial gradients differ: the checkpoint keeps their mean, which every
    rank takes back; the group's step averages over the ranks, so the resumed run ends
    where the uninterrupted one did (up to the order of the additions)."""
    job = Path(__file__).parent / "jobs" / "accum_job.py"
    inside = tmp_path / "inside.pt"
    runs = {}
    for name, extra in (
        ("whole", ["--save-at", "2", str(inside)]),
        ("resumed", ["--resume", str(inside)]),
    ):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(job), str(tmp_path / name), *extra]  # fmt: skip
        env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
        proc = forked.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = torch.load(tmp_path / name / "final.pt", weights_only=True)
    saved = torch.load(inside, weights_only=True)["accumulation"]["grads"]
    assert set(saved) == set(runs["whole"])  # every parameter's partial gradient
    for key, value in runs["whole"].items():
        torch.testing.assert_close(runs["resumed"][key], value, rtol=1e-5, atol=1e-6)

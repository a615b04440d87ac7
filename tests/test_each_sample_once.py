"""Each sample once under DDP (docs/distributed.md): real torchrun jobs over 25 samples in batches
of 2, so the ranks' shares are uneven. 2 ranks: rank 0 has 13 samples (7 batches), rank 1 has
12 (6) and joins each epoch's last iteration without a batch. A 2-rank checkpoint taken 3
batches into epoch 2 continues on 3 ranks: 13 samples left (5, 4, 4), then 25 (9, 8, 8).
Gradients accumulate over 3 batches. Every rank notes the sample ids its steps see; no
sample is padded in twice, every rank ends with the same weights, and those equal a
hand-written loop over the same batches (the job: jobs/each_sample_once_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hookrun.testing import forked
from jobs.each_sample_once_job import ACCUM, EPOCHS, SAMPLES, SAVE_AT, dataset, model, optimizer

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

JOB = Path(__file__).parent / "jobs" / "each_sample_once_job.py"


def torchrun(work_dir: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(JOB),
        str(work_dir),
        *args,
    ]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    done = forked.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


Steps = list[list[tuple[int, int, int, list[int] | None]]]
"""Per rank, per iteration: (iteration, epoch, batch index, sample ids or None)."""


def steps(work_dir: Path, ranks: int) -> Steps:
    return [
        [tuple(s) for s in json.loads((work_dir / f"steps_rank{r}.json").read_text())]
        for r in range(ranks)
    ]


def ids(ranks: Steps, epoch: int, upto: int = 99) -> list:
    """The sample ids trained in ``epoch`` by iterations up to ``upto``, all ranks, sorted."""
    return sorted(
        i
        for rank in ranks
        for it, e, _, got in rank
        if e == epoch and it <= upto
        for i in got or []
    )


def reference(ranks: Steps, net: nn.Module, opt: torch.optim.Optimizer) -> None:
    """DDP's update by hand: each rank's batches' mean losses, divided by the accumulation
    and summed over the ranks that have a batch, divided by the number of ranks; a step at
    every third batch of an epoch and at its last."""
    data, world = dataset(), len(ranks)
    per_epoch = {}
    for _, epoch, index, _ in ranks[0]:
        per_epoch[epoch] = max(per_epoch.get(epoch, 0), index + 1)
    opt.zero_grad()
    for k, (_, epoch, index, _) in enumerate(ranks[0]):
        for rank in ranks:
            got = rank[k][3]
            if got is not None:
                x, y, _ = data[got]
                (nn.functional.cross_entropy(net(x), y) / ACCUM / world).backward()
        if (index + 1) % ACCUM == 0 or index + 1 == per_epoch[epoch]:
            opt.step()
            opt.zero_grad()


def assert_by_hand(
    ranks: Steps, work_dir: Path, net: nn.Module, opt: torch.optim.Optimizer
) -> None:
    """Every rank's final weights are rank 0's, and equal the hand-written loop's."""
    final = [torch.load(work_dir / f"rank{r}.pt")["weights"] for r in range(len(ranks))]
    reference(ranks, net, opt)
    for name, value in net.state_dict().items():
        assert all(torch.equal(final[0][name], other[name]) for other in final[1:]), name
        torch.testing.assert_close(final[0][name], value, rtol=1e-5, atol=1e-6)


def test_each_sample_once_on_uneven_shares_and_after_resuming_on_three_ranks(tmp_path):
    two = tmp_path / "two"
    torchrun(two, 2)
    ranks = steps(two, 2)
    assert [len(r) for r in ranks] == [21, 21]  # 3 epochs of 7 iterations on every rank
    for epoch in range(EPOCHS):
        assert ids(ranks, epoch) == list(range(SAMPLES))  # each sample once
        # rank 1's 12 samples end a batch early: it joins the epoch's last iteration
        assert ranks[1][7 * epoch + 6] == (7 * epoch + 7, epoch, 6, None)
        assert all(got is not None for *_, got in ranks[0])
    net = model()
    assert_by_hand(ranks, two, net, optimizer(net))

    three = tmp_path / "three"
    checkpoint = two / "checkpoints" / f"iter_{SAVE_AT}.pt"
    resumed = torchrun(three, 3, "--resume-from", str(checkpoint))
    assert "epoch 2 continues after 12 of its samples" in resumed.stdout
    assert "repeated" not in resumed.stdout
    on_three = steps(three, 3)
    # epoch 2: 12 samples on 2 ranks before the checkpoint, the other 13 on 3 ranks
    assert sorted(ids(ranks, 1, upto=SAVE_AT) + ids(on_three, 1)) == list(range(SAMPLES))
    assert ids(on_three, 2) == list(range(SAMPLES))
    # 13 left: 5, 4, 4 samples, 3, 2, 2 batches; then 9, 8, 8: 5, 4, 4 batches
    assert [[got is None for *_, got in rank] for rank in on_three] == [
        [False] * 8,
        *[[False, False, True, False, False, False, False, True]] * 2,
    ]
    saved = torch.load(checkpoint)
    net = model()
    net.load_state_dict(saved["model"])
    opt = optimizer(net)
    opt.load_state_dict(saved["optimizers"]["main"])
    assert_by_hand(on_three, three, net, opt)

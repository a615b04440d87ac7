"""Each sample once under DDP (DESIGN §8, §12): real torchrun jobs over 25 samples in batches
of 2, so the ranks' shares are uneven. 2 ranks: rank 0 has 13 samples (7 batches), rank 1 has
12 (6) and joins each epoch's last iteration without a batch. A 2-rank checkpoint taken 3
batches into epoch 2 continues on 3 ranks: 13 samples left (5, 4, 4), then 25 (9, 8, 8).
Gradients accumulate over 3 batches. Every rank notes the sample ids its steps see; no
sample is padded in twice, every rank ends with the same weights, and those equal a
hand-written loop over the same batches.

This file is also the job: ``torchrun --nproc-per-node=N test_each_sample_once.py WORK_DIR
[--resume-from CHECKPOINT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

SAMPLES, BATCH, EPOCHS, SAVE_AT = 25, 2, 3, 10  # SAVE_AT: 7 iterations of epoch 1, then 3
ACCUM = 3  # on 3 ranks the last group of an epoch is batches 4 and 5: the join holds batch 4's


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 3, generator=g)
    y = (x[:, 0] > 0).long()
    return TensorDataset(x, y, torch.arange(SAMPLES))  # the third item: the sample's id


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def optimizer(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


class Recorder:
    """Each iteration's sample ids on this rank (None: it joined without a batch)."""

    def __init__(self, save_at: int | None) -> None:
        self.steps: list[tuple[int, int, int, list[int] | None]] = []
        self.save_at = save_at

    @hookimpl
    def before_train_iter(self, runner: Any, batch_idx: int, batch: Any) -> None:
        ids = None if batch is None else batch[2].tolist()
        self.steps.append((runner.iter + 1, runner.epoch, batch_idx, ids))

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.save_at:
            runner.save_checkpoint(runner.checkpoint_dir / f"iter_{self.save_at}.pt")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--resume-from", type=Path)
    args = parser.parse_args(argv)
    net = model()
    recorder = Recorder(None if args.resume_from else SAVE_AT)
    runner = Runner(
        net,
        DataLoader(dataset(), batch_size=BATCH, shuffle=True),
        optimizer=optimizer(net),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=EPOCHS,
        grad_accum=ACCUM,
        work_dir=args.work_dir,
        writers=(),
        hooks=[recorder],
        seed=5,
        dist_timeout=60,
    )
    runner.train(resume=args.resume_from)
    torch.save(
        {"weights": net.state_dict(), "optimizer": runner.optimizer.state_dict()},
        args.work_dir / f"rank{runner.rank}.pt",
    )
    (args.work_dir / f"steps_rank{runner.rank}.json").write_text(json.dumps(recorder.steps))


def torchrun(work_dir: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        __file__,
        str(work_dir),
        *args,
    ]
    env = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
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
    opt.load_state_dict(saved["optimizer"])
    assert_by_hand(on_three, three, net, opt)


if __name__ == "__main__":
    main()

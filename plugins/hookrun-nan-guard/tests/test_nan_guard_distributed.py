"""Two real gloo processes: a NaN batch on one rank makes every rank skip the same step."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = """
import math, sys
import torch
from hookrun import Runner, hookimpl
from hookrun.testing import toy_runner_kwargs

class NanOnRank1:
    @hookimpl
    def before_train_iter(self, runner, batch):
        if runner.rank == 1 and runner.iter == 2:
            batch[0][0, 0] = math.nan

torch.set_num_threads(1)
runner = Runner(**toy_runner_kwargs(sys.argv[1], val_dataloader=None, device="cpu",
                                    plugins={"nan_guard": {}}, hooks=[NanOnRank1()]))
runner.train()
torch.save({"weights": runner.unwrapped_model.state_dict(),
            "guard": runner.plugins["nan_guard"].state_dict()},
           f"{sys.argv[1]}/rank{runner.rank}.pt")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_rank_skips_the_step_one_rank_poisoned(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    env = dict(os.environ, HOOKRUN_PLUGINS_AUTOLOAD="0", OMP_NUM_THREADS="1", WORLD_SIZE="2")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "job.py"), str(tmp_path)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["guard"] == ranks[1]["guard"]
    assert ranks[0]["guard"]["skipped"] == 1
    for name, value in ranks[0]["weights"].items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, ranks[1]["weights"][name]), name

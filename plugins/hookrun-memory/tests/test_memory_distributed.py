"""Two real gloo processes: rank 0 reports the maximum over ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, os, sys
import torch
from hookrun import Runner, hookimpl
from hookrun.testing import toy_runner_kwargs

class Hold:
    priority = 90  # after the memory plugin's reduction
    kept = []

    @hookimpl
    def after_train_iter(self, runner):
        if runner.iter == 0 and runner.rank == 1:  # rank 1 alone holds 256 MiB more
            self.kept.append(torch.ones(256 * 2**20, dtype=torch.uint8))
        if runner.iter == 1:
            with open("/proc/self/status") as status:
                rss = [l for l in status if l.startswith("VmRSS:")][0].split()[1]
            with open(os.path.join(sys.argv[1], f"rank{runner.rank}.json"), "w") as out:
                json.dump({"rss": int(rss) / 1024}, out)

torch.set_num_threads(1)
kwargs = toy_runner_kwargs(sys.argv[1], val_dataloader=None, log_interval=2, device="cpu",
                           plugins={"memory": {}}, hooks=[Hold()], writers=("jsonl",))
Runner(**kwargs).train()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rank_0_reports_the_maximum_over_ranks(tmp_path: Path) -> None:
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
    own = [json.loads((tmp_path / f"rank{r}.json").read_text())["rss"] for r in range(2)]
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    reported = {r["step"]: r["train/memory/rss"] for r in map(json.loads, lines) if "step" in r}
    # the report after iteration 1 (step 2) is rank 1's figure, 256 MiB above rank 0's own
    assert own[1] > own[0] + 200
    assert abs(reported[2] - own[1]) < 16, (reported, own)

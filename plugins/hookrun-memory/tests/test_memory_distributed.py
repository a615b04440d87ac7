"""Two real gloo processes: rank 0 reports the maximum over ranks."""

from __future__ import annotations

import json
from pathlib import Path

from hookrun.testing import run_ranks

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


def test_rank_0_reports_the_maximum_over_ranks(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    run_ranks(tmp_path / "job.py", tmp_path)
    own = [json.loads((tmp_path / f"rank{r}.json").read_text())["rss"] for r in range(2)]
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    reported = {r["step"]: r["train/memory/rss"] for r in map(json.loads, lines) if "step" in r}
    # the report after iteration 1 (step 2) is rank 1's figure, 256 MiB above rank 0's own
    assert own[1] > own[0] + 200
    assert abs(reported[2] - own[1]) < 16, (reported, own)

"""Two real gloo processes: a NaN batch on one rank makes every rank skip the same step."""

from __future__ import annotations

from pathlib import Path

import torch

from hookrun.testing import run_ranks

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


def test_every_rank_skips_the_step_one_rank_poisoned(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    run_ranks(tmp_path / "job.py", tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["guard"] == ranks[1]["guard"]
    assert ranks[0]["guard"]["skipped"] == 1
    for name, value in ranks[0]["weights"].items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, ranks[1]["weights"][name]), name

"""``strategy: fsdp`` with real processes: torchrun, gloo, two ranks (jobs in fsdp_job.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from fsdp_job import Block, build, model
from torch import nn

from hookrun import Runner
from hookrun.arguments import FsdpSettings
from hookrun.errors import ConfigError
from hookrun.fsdp import units_to_shard
from hookrun.testing import run_job, toy_data

JOB = Path(__file__).with_name("fsdp_job.py")


def torchrun(*args: str | Path, expect: int = 0):
    """Two ranks on the CPU (gloo) under the real launcher."""
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args]
    return run_job(command, expect=expect, env={**os.environ, "OMP_NUM_THREADS": "1"})


def scalars(work_dir: Path, name: str) -> dict[int, float]:
    lines = (work_dir / "log.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return {row["step"]: row[name] for row in rows if name in row}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One launch: the same 2-rank run under DDP, then under FSDP (fsdp_job.compare)."""
    work_dir = tmp_path_factory.mktemp("compare")
    torchrun(JOB, work_dir, "compare")
    return work_dir


def test_fsdp_ends_with_the_weights_metrics_and_hook_points_of_ddp(compared):
    # 40 samples, batches of 4 per rank, accumulation over 2, clip at 0.05, SGD + momentum:
    # FSDP2 reduces the same sums as DDP, so the weights agree to float rounding (bit for
    # bit here; the tolerance allows another order of the reduction).
    for rank in (0, 1):
        result = torch.load(compared / f"compare_rank{rank}.pt", weights_only=True)
        ddp, fsdp = result["ddp"], result["fsdp"]
        assert set(fsdp["sharded"]) == {"DTensor"} and set(ddp["sharded"]) == {"Parameter"}
        assert fsdp["weights"].keys() == ddp["weights"].keys()
        for name, tensor in ddp["weights"].items():
            torch.testing.assert_close(fsdp["weights"][name], tensor, rtol=0, atol=1e-6)
        assert fsdp["metrics"] == pytest.approx(ddp["metrics"], rel=1e-6)
        assert fsdp["calls"] == ddp["calls"]
        # rank 0 has two validation batches of 9 samples, rank 1 one
        assert ddp["calls"].count("after_val_iter@10") == 2 - rank
    start = torch.load(compared / "start.pt", weights_only=True)
    assert not torch.equal(start["4.weight"], ddp["weights"]["4.weight"])  # it trained


def test_clipping_sees_the_norm_of_every_shard(compared):
    ddp = scalars(compared / "ddp", "train/grad_norm")
    fsdp = scalars(compared / "fsdp", "train/grad_norm")
    assert ddp.keys() == fsdp.keys() and len(ddp) >= 2
    assert fsdp == pytest.approx(ddp, rel=1e-6)
    assert min(ddp.values()) > 0.05  # the clip (0.05) was in force at every step


def test_torchrun_cli_trains_with_strategy_fsdp(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "task": f"{JOB}:build",
                "runner": {
                    "max_epochs": 1,
                    "strategy": "fsdp",
                    "fsdp": {"wrap": ["Block"], "reshard_after_forward": False},
                    "work_dir": str(tmp_path / "run"),
                    "writers": ["jsonl"],
                },
            }
        )
    )
    torchrun("-m", "hookrun", "train", config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "val/accuracy" in row] == [5]


def test_fsdp_in_one_process_is_a_one_line_config_error(tmp_path):
    work_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        Runner(**build(), strategy="fsdp", work_dir=work_dir)
    assert str(info.value) == (
        "runner.strategy: 'fsdp' shards the model over processes and this run has one; start "
        "it with torchrun --nproc-per-node=N (N > 1), or use strategy auto"
    )
    assert not work_dir.exists()


def test_wrap_names_a_class_the_model_lacks():
    with pytest.raises(ConfigError) as info:
        units_to_shard(model(), FsdpSettings(wrap=["Block", "TransformerBlock"]))
    assert str(info.value) == (
        "runner.fsdp.wrap: no submodule of class 'TransformerBlock' in the model (its classes: "
        "BatchNorm1d, Block, Linear)"
    )


def test_units_by_name_and_by_parameter_count():
    net = model()  # Linear(6,16): 112, BatchNorm1d: 32, Block: 272 each, Linear(16,2): 34
    blocks = [m for m in net.modules() if isinstance(m, Block)]
    assert units_to_shard(net, FsdpSettings(wrap=["Block"])) == blocks
    by_size = units_to_shard(net, FsdpSettings(min_params=100))
    assert by_size == [net[0], blocks[0].linear, blocks[1].linear]  # innermost first
    assert units_to_shard(net, FsdpSettings()) == []


def test_runner_fsdp_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError) as info:
        Runner(nn.Linear(2, 2), toy_data(), strategy="fsdp", fsdp={"wrapp": []}, work_dir=tmp_path)
    assert (
        str(info.value) == "runner.fsdp.wrapp: unknown key (did you mean 'wrap'?) (keys: "
        "wrap, min_params, reshard_after_forward, cpu_offload)"
    )

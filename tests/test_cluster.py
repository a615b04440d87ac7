"""Distributed set-up that needs no processes: SLURM's variables, which loaders can be
sharded, sharding a user's sampler, ranks that resumed differently, sync_bn off CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from hookrun import already_sharded
from hookrun.checkpoint.fit import disagreement
from hookrun.data.sharding import ShardedSampler, eval_sampler, train_sampler
from hookrun.distributed.cluster import first_host, launch_env, slurm_env
from hookrun.errors import ConfigError
from hookrun.testing import toy_model, toy_runner_kwargs

SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456"}


def test_slurm_variables_give_rank_world_local_rank_and_master():
    env = {**SRUN, "SLURM_JOB_NODELIST": "gpu[07-09,12],cpu1"}
    assert slurm_env(env) == {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(20000 + 123456 % 20000),
    }
    mine = {**env, "MASTER_ADDR": "head", "MASTER_PORT": "29500"}  # the user's own win
    assert (slurm_env(mine)["MASTER_ADDR"], slurm_env(mine)["MASTER_PORT"]) == ("head", "29500")
    torchrun = {**env, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}
    assert slurm_env(torchrun) == {}  # srun starting torchrun: torchrun's variables count
    assert launch_env(torchrun)["WORLD_SIZE"] == "2"
    assert launch_env({}) == {}
    assert [first_host(n) for n in ("node1", "n[1-4]", "a-b[010,012],c", "x[3]")] == [
        "node1",
        "n1",
        "a-b010",
        "x3",
    ]


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(4)


def test_a_loader_hookrun_cannot_shard_is_an_error_unless_declared_sharded():
    data = TensorDataset(torch.arange(8.0))
    fixed = BatchSampler(SequentialSampler(data), 2, False)
    cases = {
        "an IterableDataset (Stream)": DataLoader(Stream(), batch_size=2),
        "its own batch_sampler (BatchSampler)": DataLoader(data, batch_sampler=fixed),
        "a list, not a DataLoader": [torch.zeros(2)],
    }
    for what, loader in cases.items():
        with pytest.raises(ConfigError) as caught:
            train_sampler(loader, "train_dataloader", 0, 1, 2)
        assert str(caught.value).startswith("train_dataloader: a")
        assert what in str(caught.value) and "hookrun.already_sharded(loader)" in str(caught.value)
        with pytest.raises(ConfigError, match="^val_dataloader: "):
            eval_sampler(loader, "val_dataloader", 0, 1, 2)
        assert train_sampler(loader, "train_dataloader", 0, 0, 1) is None  # one process: fine
        declared = already_sharded(loader)
        assert train_sampler(declared, "train_dataloader", 0, 1, 2) is None
        assert eval_sampler(declared, "val_dataloader", 0, 1, 2) is None
        assert len(list(declared)) == len(list(loader))


def test_a_weighted_sampler_keeps_its_weights_and_its_order_across_ranks():
    weights = torch.tensor([0.0, 0.0, 1.0, 1.0, 5.0, 0.0, 2.0, 1.0, 0.0, 3.0])
    sampler = WeightedRandomSampler(weights, num_samples=30)
    one = list(ShardedSampler(sampler, seed=7, rank=0, world=1, pad=True))
    shares = [list(ShardedSampler(sampler, seed=7, rank=r, world=3, pad=True)) for r in range(3)]
    assert all(weights[i] > 0 for i in one)  # zero weights never drawn
    assert [shares[p % 3][p // 3] for p in range(30)] == one  # one process's order, dealt out


def test_evaluation_shards_do_not_pad_and_training_shards_do():
    sampler = SequentialSampler(range(7))
    evaluation = [list(ShardedSampler(sampler, 0, r, 3, pad=False)) for r in range(3)]
    assert evaluation == [[0, 3, 6], [1, 4], [2, 5]]
    training = [list(ShardedSampler(sampler, 0, r, 3, pad=True)) for r in range(3)]
    assert training == [[0, 3, 6], [1, 4, 0], [2, 5, 1]]


def test_ranks_that_resumed_differently_are_named_in_one_line():
    assert disagreement([("iter_9.pt", 9), ("iter_9.pt", 9)]) is None
    line = disagreement([("iter_9.pt", 9), (None, 0)])
    assert line == (
        "ranks resumed from different checkpoints: rank 0 iter_9.pt at iteration 9, "
        "rank 1 nothing (fresh start) at iteration 0; every rank must read the same "
        "checkpoint folder (shared storage)"
    )


def test_sync_bn_off_cuda_is_a_config_error(tmp_path):
    from hookrun import Runner

    kwargs = toy_runner_kwargs(tmp_path, model=toy_model(batch_norm=True), sync_bn=True)
    kwargs["device"] = "cpu"
    with pytest.raises(
        ConfigError, match=r"^runner.sync_bn: SyncBatchNorm needs CUDA \(device is cpu\)$"
    ):
        Runner(**kwargs)

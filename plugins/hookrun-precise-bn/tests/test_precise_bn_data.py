"""Where precise_bn's batches come from: its own loader, never the training iterator."""

from __future__ import annotations

import pytest
import torch
from hookrun_precise_bn import shuffled_batches, training_batches
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from hookrun import ConfigError


def test_rank_shares_are_disjoint_equal_and_cover_the_order() -> None:
    shares = [shuffled_batches(103, 10, False, seed=5, rank=r, world_size=2) for r in range(2)]
    assert [len(s) for s in shares] == [6, 6]  # 51 samples each: batches of 10 and a 1
    indices = [i for share in shares for batch in share for i in batch]
    assert len(indices) == len(set(indices)) == 102  # one sample cut so shares are equal
    assert shuffled_batches(103, 10, False, 5, 0, 2) == shares[0]  # same seed, same order
    assert shuffled_batches(103, 10, False, 6, 0, 2) != shares[0]
    assert all(len(b) == 10 for b in shuffled_batches(103, 10, True, 5, 0, 1))  # drop_last


def test_map_style_loader_is_capped_at_one_pass_and_keeps_collate() -> None:
    data = TensorDataset(torch.arange(25.0))
    loader = DataLoader(data, batch_size=4, collate_fn=lambda items: ("collated", len(items)))
    batches = list(training_batches(loader, num_batches=100, seed=0))
    assert batches == [("collated", 4)] * 6 + [("collated", 1)]


def test_custom_batch_sampler_is_copied_not_advanced() -> None:
    sampler = BatchSampler(RandomSampler(range(12)), batch_size=3, drop_last=False)
    sampler.sampler.generator = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.arange(12)), batch_sampler=sampler)
    state = sampler.sampler.generator.get_state()
    assert len(list(training_batches(loader, num_batches=2, seed=0))) == 2
    assert torch.equal(sampler.sampler.generator.get_state(), state)


def test_lists_are_reiterated_and_one_shot_iterators_refused() -> None:
    batches = [torch.zeros(2, 3), torch.ones(2, 3)]
    assert len(list(training_batches(batches, num_batches=1, seed=0))) == 1
    with pytest.raises(ConfigError, match="plugins.precise_bn: needs a train_dataloader"):
        training_batches(iter(batches), num_batches=1, seed=0)

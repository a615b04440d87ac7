"""The data and network of the distributed test, imported by it and by the ranks it starts."""

from __future__ import annotations

import torch
from torch import nn


def large_mean_data(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1000 + 0.1 * torch.randn(n, 4, generator=g, dtype=torch.float64)).float()


def deep_net() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 5), nn.BatchNorm1d(5)
    )


def rank_batches(rank: int) -> list:
    sizes = [(50, 50, 3), (40, 40, 7, 2)][rank]
    x = large_mean_data(sum(sizes), seed=10 + rank)
    return [(b, None) for b in torch.split(x, sizes)]

"""The digits job: a small CNN with BatchNorm on scikit-learn's bundled 8x8 digits.

1,797 real handwritten digits ship inside scikit-learn, so nothing is downloaded. The split
(70 % train, 15 % val, 15 % test) is fixed by ``split_seed``, independent of the run's seed.
"""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class DigitsCNN(nn.Module):
    """Two conv-BN-ReLU blocks and a linear classifier; about 25 k parameters."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(width * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).float().mean()


def splits(split_seed: int = 0) -> dict[str, TensorDataset]:
    """Stratified 70/15/15 train/val/test datasets, pixels scaled to [0, 1]."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx = list(range(len(y)))
    train, rest = train_test_split(idx, test_size=0.3, random_state=split_seed, stratify=y)
    val, test = train_test_split(rest, test_size=0.5, random_state=split_seed, stratify=y[rest])
    return {
        name: TensorDataset(x[i], y[i])
        for name, i in (("train", train), ("val", val), ("test", test))
    }


def build(
    batch_size: int = 64,
    width: int = 32,
    split_seed: int = 0,
    num_threads: int | None = 1,
) -> dict[str, Any]:
    """What ``hookrun train`` needs from Python: model, loaders, loss and metrics. The
    optimizer and its learning-rate schedule are declared in the config (``optimizer:``,
    ``scheduler:``), so their length follows ``runner.max_epochs`` by itself.

    ``num_threads``: convolutions this small run fastest on one CPU thread (more threads
    only add synchronisation, and stall badly on a busy machine); null keeps torch's choice.
    """
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    data = splits(split_seed)
    return {
        "model": DigitsCNN(width),
        "train_dataloader": DataLoader(data["train"], batch_size=batch_size, shuffle=True),
        "val_dataloader": DataLoader(data["val"], batch_size=256),
        "test_dataloader": DataLoader(data["test"], batch_size=256),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": accuracy},
    }

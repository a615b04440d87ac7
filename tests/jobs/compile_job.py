"""A 2-rank run (DDP, or FSDP with every ``Linear`` a unit) of a model whose
``training_step`` calls ``self(x)``, compiled or not.

Usage (as the ranks of one job): compile_job.py WORK_DIR [--compile] [--fsdp]
Rank 0 saves the final (whole) weights to ``WORK_DIR/weights.pt``; every rank prints the
number of graphs dynamo compiled (``graphs N``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)


def main(work_dir: Path, compile: bool, fsdp: bool) -> None:
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    runner = Runner(
        model=model,
        train_dataloader=DataLoader(data, batch_size=4),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        max_epochs=2,
        work_dir=work_dir,
        writers=(),
        plugins={},
        compile={"backend": "eager"} if compile else False,
        strategy="fsdp" if fsdp else "ddp",
        fsdp={"wrap": ["Linear"]} if fsdp else None,
    )
    runner.train()
    print("graphs", counters["stats"]["unique_graphs"], flush=True)
    weights = {  # FSDP's shards gathered (every rank takes part)
        k: v.full_tensor() if isinstance(v, DTensor) else v
        for k, v in runner.unwrapped_model.state_dict().items()
    }
    if runner.is_main:
        torch.save(weights, work_dir / "weights.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--compile" in sys.argv[2:], "--fsdp" in sys.argv[2:])

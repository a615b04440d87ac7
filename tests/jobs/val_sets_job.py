"""Two ranks validating two named sets of uneven sizes, training 2 batches per epoch
(``limit_train_batches``). Usage: python val_sets_job.py WORK_DIR (as each rank, see
``hookrun.testing.run_ranks``). Rank 0 writes ``metrics.json`` (the last validation's
metrics) and ``model.pt`` (the final weights)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner


def sets() -> dict[str, DataLoader]:
    """Two validation sets of 10 and 7 samples (no equal split over 2 ranks)."""
    g = torch.Generator().manual_seed(3)
    found = {}
    for name, n in (("id", 10), ("ood", 7)):
        x, y = torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
        found[name] = DataLoader(TensorDataset(x, y), batch_size=3)
    return found


def main(work_dir: Path) -> None:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    runner = Runner(
        model,
        DataLoader(train, batch_size=4, shuffle=True),
        val_dataloader=sets(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        max_epochs=2,
        limit_train_batches=2,
        work_dir=work_dir,
        writers=(),
    )
    runner.train()
    if runner.is_main:
        (work_dir / "metrics.json").write_text(json.dumps(runner.last_metrics["val"]))
        torch.save(runner.unwrapped_model.state_dict(), work_dir / "model.pt")
        print(f"iterations {runner.iter}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Prediction on each rank of a torch.distributed job, for tests/test_predict.py (run it with
``hookrun.testing.run_ranks``).

Usage: python predict_job.py OUT_DIR api
       python predict_job.py OUT_DIR cli HOOKRUN_ARGS...

``api``: ``Runner.predict`` of :func:`model` over :func:`samples` in batches of 3 (11 samples:
the ranks' shares are uneven); each rank saves what it got as ``rank<R>.pt`` and the rows
it predicted itself as ``rows<R>.pt``. ``cli``: ``hookrun HOOKRUN_ARGS`` in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hookrun import Runner, hookimpl

SAMPLES = 11


class Indexed(Dataset):
    """Sample ``i`` is ``{"index": i, "x": row i}``: outputs say which sample they are."""

    def __init__(self) -> None:
        self.x = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(5))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index, "x": self.x[index]}


class Predictor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)

    def predict_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"index": batch["index"], "logits": self.linear(batch["x"])}


class Rows:
    """The dataset indices this rank predicted, batch by batch."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    @hookimpl
    def after_predict_iter(self, outputs: dict[str, torch.Tensor]) -> None:
        self.rows += outputs["index"].tolist()


def main(out: Path, mode: str, args: list[str]) -> None:
    if mode == "cli":
        from hookrun.cli.commands import main as hookrun

        hookrun(args)
    rows = Rows()
    runner = Runner(Predictor(), hooks=[rows], work_dir=out / "run", writers=())
    outputs = runner.predict(DataLoader(Indexed(), batch_size=3))
    torch.save(outputs, out / f"rank{runner.rank}.pt")
    torch.save(torch.tensor(rows.rows), out / f"rows{runner.rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])

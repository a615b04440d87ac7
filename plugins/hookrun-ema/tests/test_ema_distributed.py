"""Two real gloo processes: each rank averages the DDP-wrapped model's weights alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ema_testing import accuracy, bn_mlp, loader
from torch import nn

from hookrun import Runner
from hookrun.testing import once_per_session, run_ranks

SCRIPT = """
import json, os, sys
import torch
from torch import nn
from hookrun import Runner
from ema_testing import accuracy, bn_mlp, loader

torch.set_num_threads(1)
for name, (buffers, validate) in json.loads(sys.argv[2]).items():
    model = bn_mlp()
    runner = Runner(
        model, train_dataloader=loader(96, seed=0, shuffle=True),
        val_dataloader=loader(48, seed=1, shuffle=False) if validate else None,
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy}, optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
        max_epochs=2, work_dir=os.path.join(sys.argv[1], name), writers=(), device="cpu",
        plugins={"ema": {"decay": 0.9, "buffers": buffers}},
    )
    runner.train()
    assert isinstance(runner.model, nn.parallel.DistributedDataParallel)
    state = runner.plugins["ema"].state_dict()
    torch.save({"ema": state["model"], "val": runner.last_metrics.get("val")},
               os.path.join(sys.argv[1], name, f"rank{runner.rank}.pt"))
"""
MODES = {"copy-validate": ("copy", True), "average-alone": ("average", False)}


@pytest.fixture
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case of ``MODES`` trained one after the other by the same two ranks: one launch
    per test session (the ranks' start-up is most of the cost), a folder per case."""

    def launch(folder: Path) -> None:
        (folder / "job.py").write_text(SCRIPT)
        run_ranks(folder / "job.py", folder, json.dumps(MODES), path=[Path(__file__).parent])

    return once_per_session(request, tmp_path_factory, "ema_two_gloo_ranks", launch)


@pytest.mark.parametrize("mode", list(MODES))
def test_two_gloo_ranks_keep_the_same_average(runs: Path, tmp_path: Path, mode: str) -> None:
    """Every rank's BatchNorm statistics come from its own batches: the ranks' averages of
    them agree also without a validation (which evaluates rank 0's)."""
    _, validate = MODES[mode]
    ranks = [torch.load(runs / mode / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["val"] == ranks[1]["val"]
    for key, value in ranks[0]["ema"].items():
        assert torch.equal(value, ranks[1]["ema"][key]), key
    if not validate:
        return
    # the metrics validation reported are those of the averaged weights
    model = bn_mlp()
    model.load_state_dict(ranks[0]["ema"])
    alone = Runner(
        model,
        val_dataloader=loader(48, seed=1, shuffle=False),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        work_dir=tmp_path / "alone",
        writers=(),
        device="cpu",
        plugins={},
    )
    val = alone.val()
    assert val.keys() == ranks[0]["val"].keys()
    for key, value in val.items():
        assert abs(value - ranks[0]["val"][key]) <= 1e-6 * max(1.0, abs(value)), key

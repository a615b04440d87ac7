"""Two real gloo processes: the reduced statistics equal one process over the union of batches."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch
from hookrun_precise_bn import bn_layers, model_forward, recompute_bn_stats
from precise_bn_testing import deep_net, large_mean_data, rank_batches

from hookrun.testing import run_ranks

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from hookrun import Runner
    from hookrun_precise_bn import bn_layers, model_forward, recompute_bn_stats
    from precise_bn_testing import deep_net, large_mean_data, rank_batches

    rank, out = int(os.environ["RANK"]), sys.argv[1]
    x = large_mean_data(200, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
    loader = DataLoader(TensorDataset(x, torch.zeros(200, dtype=torch.long)), batch_size=30)
    runner = Runner(
        model=model, train_dataloader=loader, criterion=nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01), max_epochs=1,
        work_dir=os.path.join(out, "run"), writers=(), device="cpu",
        plugins={"precise_bn": {}},
    )
    runner.train()  # DDP over gloo; each rank recomputes over its own half of the data
    assert runner.world_size == 2

    deep = deep_net()  # the reduction alone, with different batches (and sizes) per rank
    batches = rank_batches(rank)
    recompute_bn_stats(deep, bn_layers(deep)[0], batches, lambda b: model_forward(deep, b))
    torch.save({"runner": model[0].state_dict(), "deep": deep.state_dict()},
               os.path.join(out, f"rank{rank}.pt"))
    """
)


def test_two_gloo_ranks_equal_one_process_over_the_union(tmp_path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    run_ranks(tmp_path / "job.py", tmp_path, path=[Path(__file__).parent])
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    deep = deep_net()  # one process over both ranks' batches
    union = rank_batches(0) + rank_batches(1)
    recompute_bn_stats(deep, bn_layers(deep)[0], union, lambda b: model_forward(deep, b))
    for result in results:
        for name, value in deep.state_dict().items():
            if name.endswith("running_mean"):
                scale = 1 + value.abs().max()
                assert (result["deep"][name] - value).abs().max() <= 1e-6 * scale, name
            elif name.endswith("running_var"):
                assert ((result["deep"][name] - value) / value).abs().max() <= 1e-6, name

    x = large_mean_data(200, seed=0).double()  # the runner's ranks covered all 200 samples
    for result in results:
        mean, var = result["runner"]["running_mean"].double(), result["runner"]["running_var"]
        assert ((mean - x.mean(0)).abs() <= 1e-6 * x.mean(0)).all()
        assert ((var.double() - x.var(0)) / x.var(0)).abs().max() <= 1e-4

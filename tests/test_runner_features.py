"""Runner features checked against results computed another way."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner, hookimpl
from hookrun.errors import ConfigError
from hookrun.testing import toy_data, toy_runner_kwargs


def fixed_data(n=16, batch_size=4):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def test_gradient_accumulation_equals_the_large_batch_step(tmp_path):
    torch.manual_seed(0)
    small, large = nn.Linear(4, 2), nn.Linear(4, 2)
    large.load_state_dict(small.state_dict())
    Runner(
        small,
        fixed_data(16, 4),
        optimizer=torch.optim.SGD(small.parameters(), 0.5),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        grad_accum=2,
        writers=(),
        work_dir=tmp_path,
    ).train()
    Runner(
        large,
        fixed_data(16, 8),
        optimizer=torch.optim.SGD(large.parameters(), 0.5),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        writers=(),
        work_dir=tmp_path,
    ).train()
    for a, b in zip(small.parameters(), large.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_limits_the_step(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    before = copy.deepcopy(model)
    runner = Runner(
        model,
        fixed_data(4, 4),
        optimizer=torch.optim.SGD(model.parameters(), 1.0),
        criterion=lambda out, y: 1000 * out.sum(),
        max_epochs=1,
        clip_grad=0.5,
        writers=(),
        work_dir=tmp_path,
    )
    runner.train()
    step = torch.cat(
        [(p - q).flatten() for p, q in zip(model.parameters(), before.parameters(), strict=True)]
    )
    assert step.norm().item() == pytest.approx(0.5, rel=1e-4)
    assert runner.scalars.latest(["train/grad_norm"])["train/grad_norm"] > 100


def test_bf16_autocast_on_cpu(tmp_path):
    dtypes = []

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            out = self.lin(x)
            dtypes.append(out.dtype)
            return out

    model = Model()
    runner = Runner(
        model,
        fixed_data(),
        fixed_data(),
        optimizer=torch.optim.SGD(model.parameters(), 0.1),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        amp="bf16",
        writers=(),
        work_dir=tmp_path,
    )
    runner.train()
    assert set(dtypes) == {torch.bfloat16}
    assert model.lin.weight.dtype == torch.float32
    assert runner.last_metrics["val"]["loss"] > 0


@pytest.mark.parametrize(("interval", "steps"), [("epoch", 2), ("iter", 8)])
def test_scheduler_stepped_per_epoch_or_per_iteration(tmp_path, interval, steps):
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    Runner(
        model,
        fixed_data(16, 4),
        optimizer=optimizer,
        scheduler=scheduler,
        scheduler_interval=interval,
        criterion=nn.CrossEntropyLoss(),
        max_epochs=2,
        writers=(),
        work_dir=tmp_path,
    ).train()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5**steps)


def test_same_seed_same_weights(tmp_path):
    def train(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
        torch.manual_seed(123)  # same init; only the runner's seed differs below
        for p in model.parameters():
            nn.init.normal_(p)
        Runner(
            model,
            toy_data(16, 4),
            optimizer=torch.optim.SGD(model.parameters(), 0.1),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=2,
            seed=seed,
            writers=(),
            work_dir=tmp_path,
        ).train()
        return torch.cat([p.flatten() for p in model.parameters()])

    assert torch.equal(train(1), train(1))
    assert not torch.equal(train(1), train(2))


def test_validation_metrics_are_weighted_by_batch_size(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    val = fixed_data(10, 4)  # batches of 4, 4 and 2
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path,
            model=model,
            val_dataloader=val,
            optimizer=torch.optim.SGD(model.parameters(), 0.1),
        )
    )
    metrics = runner.val()
    x, y = val.dataset.tensors
    with torch.no_grad():
        out = model(x)
    assert metrics["loss"] == pytest.approx(nn.functional.cross_entropy(out, y).item(), rel=1e-6)
    assert metrics["accuracy"] == pytest.approx((out.argmax(1) == y).float().mean().item())


def test_val_after_train_keeps_plugin_state(tmp_path):
    class Counter:
        name = "counter"

        def __init__(self):
            self.iters = 0
            self.runs = 0

        @hookimpl
        def before_run(self):
            self.runs += 1

        @hookimpl
        def after_train_iter(self):
            self.iters += 1

    counter = Counter()
    runner = Runner(**toy_runner_kwargs(tmp_path, hooks=[counter]))
    runner.train()
    runner.val()
    assert (counter.iters, counter.runs) == (6, 2)


def test_device_auto_is_cpu_here(tmp_path):
    assert Runner(**toy_runner_kwargs(tmp_path)).device == torch.device("cpu")


def test_bad_arguments_are_reported_together(tmp_path):
    with pytest.raises(ConfigError) as info:
        Runner(**toy_runner_kwargs(tmp_path, max_iters=5, val_interval=0, amp="fp8", grad_accum=0))
    assert info.value.lines == [
        "runner.max_iters: give max_epochs or max_iters, not both (got 5)",
        "runner.val_interval: Input should be greater than or equal to 1 (got 0)",
        "runner.amp: Input should be 'bf16' or 'fp16' (got 'fp8')",
        "runner.grad_accum: Input should be greater than or equal to 1 (got 0)",
    ]


def test_fp16_without_cuda_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="'fp16' needs a CUDA device; use 'bf16' on CPU"):
        Runner(**toy_runner_kwargs(tmp_path, amp="fp16"))


def test_unsafe_plugin_state_is_refused_before_writing(tmp_path):
    import numpy as np

    class Bad:
        name = "bad"

        def state_dict(self):
            return {"best": np.float64(0.5)}

        def load_state_dict(self, state):
            pass

    runner = Runner(**toy_runner_kwargs(tmp_path, hooks=[Bad()]))
    from hookrun.errors import CheckpointError

    with pytest.raises(
        CheckpointError, match=r"checkpoint\['plugins'\]\['bad'\]\['best'\] is a numpy"
    ):
        runner.save_checkpoint(tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()
    assert list(tmp_path.glob(".x.pt*")) == []

"""precise_bn statistics against float64 references computed directly over the inputs."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hookrun_precise_bn import bn_layers, model_forward, recompute_bn_stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import PluginError, Runner, hookimpl


def large_mean_data(n: int = 203, features: int = 4, seed: int = 0) -> torch.Tensor:
    """Inputs of mean 1000 and standard deviation 0.1: fvcore's E[x²] − E[x]² goes negative."""
    g = torch.Generator().manual_seed(seed)
    return (1000 + 0.1 * torch.randn(n, features, generator=g, dtype=torch.float64)).float()


def train(model: nn.Module, loader: DataLoader, tmp_path, plugins=None, **kwargs) -> Runner:
    options = dict(
        model=model,
        train_dataloader=loader,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        work_dir=tmp_path / "run",
        writers=(),
        plugins=plugins,
    )
    options.update(kwargs)
    runner = Runner(**options)
    runner.train()
    return runner


def test_unequal_batches_with_a_large_mean_match_float64(tmp_path) -> None:
    x = large_mean_data()
    loader = DataLoader(TensorDataset(x, torch.zeros(203, dtype=torch.long)), batch_size=50)
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2))
    buffers = (model[0].running_mean.data_ptr(), model[0].running_var.data_ptr())
    train(model, loader, tmp_path, plugins={"precise_bn": {"num_batches": 5}})
    bn, ref = model[0], x.double()  # batches of 50, 50, 50, 50, 3 cover all 203 samples
    mean, var = bn.running_mean.double(), bn.running_var.double()
    assert ((mean - ref.mean(0)).abs() <= 1e-6 * ref.mean(0).abs()).all()
    assert (((var - ref.var(0)) / ref.var(0)).abs() <= 1e-6).all()
    assert (bn.running_mean.data_ptr(), bn.running_var.data_ptr()) == buffers  # in place


def test_float64_model_is_exact_in_absolute_terms() -> None:
    x = large_mean_data().double()
    model = nn.Sequential(nn.BatchNorm1d(4)).double()
    batches = [(b, None) for b in torch.split(x, [50, 50, 50, 50, 3])]
    recompute_bn_stats(model, bn_layers(model)[0], batches, lambda b: model_forward(model, b))
    assert (model[0].running_mean - x.mean(0)).abs().max() <= 1e-6
    assert ((model[0].running_var - x.var(0)) / x.var(0)).abs().max() <= 1e-6


@pytest.mark.parametrize("sizes", [[4096] * 16, [4096, 1000, 4096, 7, 4096, 2500, 4096, 333]])
@pytest.mark.parametrize("outlier_at", [0, 1])
def test_an_outlier_first_sample_stays_within_1e6_of_float64(sizes, outlier_at) -> None:
    """N(1000, 0.1) with one value 0, the first of all (or of the second batch): centring on
    the first sample and summing in float32 was 2.9e-3 off on the variance."""
    g = torch.Generator().manual_seed(3)
    x = (1000 + 0.1 * torch.randn(sum(sizes), 1, generator=g, dtype=torch.float64)).float()
    x[0 if outlier_at == 0 else sizes[0], 0] = 0.0
    model = nn.Sequential(nn.BatchNorm1d(1))
    batches = [(b, None) for b in torch.split(x, sizes)]
    recompute_bn_stats(model, bn_layers(model)[0], batches, lambda b: model_forward(model, b))
    ref = x.double()
    mean, var = model[0].running_mean.double(), model[0].running_var.double()
    assert ((mean - ref.mean(0)).abs() / ref.mean(0).abs()).max() <= 1e-6
    assert ((var - ref.var(0)) / ref.var(0)).abs().max() <= 1e-6


class OwnForwardBN(nn.BatchNorm2d):
    """A BatchNorm subclass with its own forward (like SyncBatchNorm): measured by a hook."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def conv_bn_net(norm=nn.BatchNorm2d) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), norm(8), nn.ReLU(), nn.Dropout(0.5),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), norm(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), norm(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3),
    )  # fmt: skip


def reference_stats(model: nn.Module, batches: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each BN layer's inputs captured in a plain pass (BN in train mode, the rest in eval),
    concatenated, and reduced in float64."""
    model = copy.deepcopy(model).eval()
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    seen: list[list[torch.Tensor]] = [[] for _ in layers]
    for bn, store in zip(layers, seen, strict=True):
        bn.train()
        bn.register_forward_pre_hook(lambda m, args, store=store: store.append(args[0].double()))
    with torch.no_grad():
        for inputs, _ in batches:
            model(inputs)
    stats = []
    for store in seen:
        flat = torch.cat(store).transpose(0, 1).flatten(1)
        stats.append((flat.mean(1), flat.var(1)))
    return stats


@pytest.mark.parametrize("norm", [nn.BatchNorm2d, OwnForwardBN])
def test_conv_bn_net_every_layer_matches_float64(norm) -> None:
    torch.manual_seed(1)
    model = conv_bn_net(norm)
    g = torch.Generator().manual_seed(2)
    batches = [(5 + 3 * torch.randn(n, 3, 8, 8, generator=g), None) for n in (16, 16, 5)]
    expected = reference_stats(model, batches)
    flags = {name: m.training for name, m in model.named_modules()}
    recompute_bn_stats(model, bn_layers(model)[0], batches, lambda b: model_forward(model, b))
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn, (mean, var) in zip(layers, expected, strict=True):
        assert (bn.running_mean.double() - mean).abs().max() <= 1e-5 * (1 + mean.abs().max())
        assert ((bn.running_var.double() - var) / var).abs().max() <= 1e-4
        assert int(bn.num_batches_tracked) == 0  # a measuring pass is not training
    assert {name: m.training for name, m in model.named_modules()} == flags


def test_eval_mode_bn_keeps_its_frozen_statistics(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))

    class FreezeSecondBN:
        @staticmethod
        def train(module: nn.Module, mode: bool = True) -> nn.Module:
            nn.Module.train(module, mode)
            module[2].eval()
            return module

    model.train = FreezeSecondBN.train.__get__(model)  # frozen BN, as in fine-tuning recipes
    model[2].running_mean.fill_(7.0)
    x = large_mean_data(64)
    loader = DataLoader(TensorDataset(x, torch.zeros(64, dtype=torch.long)), batch_size=16)
    runner = Runner(
        model=model, train_dataloader=loader,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01), criterion=nn.CrossEntropyLoss(),
        max_epochs=2, work_dir=tmp_path / "run", writers=(), plugins={"precise_bn": True},
    )  # fmt: skip
    messages: list[str] = []
    runner.info = messages.append  # type: ignore[method-assign]
    runner.train()
    assert torch.equal(model[2].running_mean, torch.full((4,), 7.0))
    assert not model[2].training and model[0].training
    assert (model[0].running_mean.double() - x.double().mean(0)).abs().max() <= 1e-3
    frozen = [m for m in messages if "eval mode (frozen)" in m]
    assert len(frozen) == 1, messages


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(lambda: nn.Sequential(nn.BatchNorm1d(4, track_running_stats=False),
                                           nn.Linear(4, 2)), id="no-running-stats"),
        pytest.param(lambda: nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4), nn.LayerNorm(4),
                                           nn.Linear(4, 2)), id="groupnorm-layernorm"),
    ],
)  # fmt: skip
def test_models_without_running_bn_are_left_alone_with_one_notice(model, tmp_path) -> None:
    torch.manual_seed(0)
    net = model()
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.zeros(32, dtype=torch.long)), 8)
    runner = Runner(
        model=net, train_dataloader=loader, optimizer=torch.optim.SGD(net.parameters(), lr=0.0),
        criterion=nn.CrossEntropyLoss(), max_epochs=3, work_dir=tmp_path / "run", writers=(),
        plugins={"precise_bn": True},
    )  # fmt: skip
    before = copy.deepcopy(net.state_dict())
    messages: list[str] = []
    runner.info = messages.append  # type: ignore[method-assign]
    runner.train()
    after = net.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    notices = [m for m in messages if "nothing to recompute" in m]
    assert len(notices) == 1, messages


def test_nan_statistics_are_replaced() -> None:
    model = nn.Sequential(nn.BatchNorm1d(4))
    model[0].running_mean.fill_(float("nan"))
    model[0].running_var.fill_(float("nan"))
    x = torch.randn(40, 4)
    recompute_bn_stats(model, bn_layers(model)[0], [(x, None)], lambda b: model_forward(model, b))
    assert torch.allclose(model[0].running_mean, x.mean(0), atol=1e-6)
    assert torch.allclose(model[0].running_var, x.var(0), rtol=1e-5)


def test_extra_models_are_recomputed_with_their_own_weights(tmp_path) -> None:
    """`models: all` asks the extra_models hook point; here a hook swaps a shadow copy in."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    shadow = copy.deepcopy(model)
    with torch.no_grad():
        shadow[0].weight.mul_(3.0)

    class Shadow:
        """Swaps the shadow's tensors into the model (storage swap, as an EMA plugin would)."""

        @staticmethod
        def swap() -> None:
            pairs = zip(
                [*model.parameters(), *model.buffers()],
                [*shadow.parameters(), *shadow.buffers()],
                strict=True,
            )
            for a, b in pairs:
                a.data, b.data = b.data, a.data

        @staticmethod
        @contextlib.contextmanager
        def swapped_in():
            Shadow.swap()
            try:
                yield
            finally:
                Shadow.swap()

        @hookimpl
        def extra_models(self, runner):
            return {"shadow": Shadow.swapped_in}

    x = torch.randn(64, 4)
    loader = DataLoader(TensorDataset(x, torch.zeros(64, dtype=torch.long)), batch_size=16)
    train(
        model, loader, tmp_path, plugins={"precise_bn": {"models": "all"}}, hooks=[Shadow()],
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
    )  # fmt: skip
    for net in (model, shadow):
        with torch.no_grad():
            inputs = net[0](x).double()
        assert torch.allclose(net[1].running_mean.double(), inputs.mean(0), atol=1e-6)
        assert torch.allclose(net[1].running_var.double(), inputs.var(0), rtol=1e-5)
    assert not torch.allclose(model[1].running_var, shadow[1].running_var)


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"num_batches": 0}, "num_batches"), ({"interval": 0}, "interval"),
     ({"models": "ema"}, "models"), ({"num_batchs": 3}, "num_batchs")],
)  # fmt: skip
def test_bad_settings_name_the_field(settings, field, tmp_path) -> None:
    model = nn.Linear(4, 2)
    with pytest.raises(PluginError, match=f"plugins.precise_bn.{field}"):
        Runner(
            model=model, criterion=nn.CrossEntropyLoss(), work_dir=tmp_path, writers=(),
            plugins={"precise_bn": settings},
        )  # fmt: skip

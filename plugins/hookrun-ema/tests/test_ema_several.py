"""Two EMA plugins in one run (``ema`` and a subclass registered as ``ema_slow``): swapping
nests, so training is the same as without any average and each average is its own formula.

Both plugins swap at ``before_val`` in call order (``ema``, then ``ema_slow``) and
``after_val`` asks them out in that same order; the model's swap stack undoes them newest
first, so the trained weights come back and each average stays its own."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ema_testing import (
    Recorder,
    accuracy,
    bn_mlp,
    classification_data,
    loader,
    reference,
    relative_error,
)
from hookrun_ema import EMA, EMASettings
from torch import nn

from hookrun import Runner, hookimpl


class SlowEMA(EMA):
    """A second average under a name of its own."""

    name = "ema_slow"


class SaveInLastValidation:
    """Saves a checkpoint in the last epoch's validation, while the averages are swapped in."""

    def __init__(self, path: Any, epoch: int) -> None:
        self.path, self.epoch = path, epoch

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        if runner.epoch == self.epoch:
            runner.save_checkpoint(self.path)


def train(
    tmp_path: Any,
    dtype: torch.dtype,
    ema: dict | None,
    slow: EMA | None,
    precise_bn: bool = False,
    extra: list[object] = (),
) -> tuple:
    """3 epochs of 6 iterations with validation after each and a test at the end; ``ema``'s
    settings enable the installed plugin, ``slow`` joins as a plugin instance."""
    model = bn_mlp(dtype)
    recorder = Recorder()
    plugins: dict[str, Any] = {} if ema is None else {"ema": ema}
    if precise_bn:
        plugins["precise_bn"] = {"num_batches": 6, "models": "all"}
    runner = Runner(
        model,
        train_dataloader=loader(96, seed=0, shuffle=True, dtype=dtype),
        val_dataloader=loader(48, seed=1, shuffle=False, dtype=dtype),
        test_dataloader=loader(32, seed=2, shuffle=False, dtype=dtype),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        max_epochs=3,
        work_dir=tmp_path,
        writers=(),
        device="cpu",
        plugins=plugins,
        hooks=[
            recorder,
            *([slow] if slow else []),
            SaveInLastValidation(tmp_path / "in_val.pt", 3),
            *extra,
        ],
    )
    runner.train()
    metrics = runner.test()
    return runner, recorder, metrics


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def clones(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` apart from the tensors that will change (a live average's)."""
    return {k: v.clone() for k, v in state.items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def evaluate_alone(tmp_path: Any, state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict:
    """Test metrics of a new model loaded with ``state``, without any plugin."""
    model = bn_mlp(dtype)
    model.load_state_dict(state)
    runner = Runner(
        model,
        test_dataloader=loader(32, seed=2, shuffle=False, dtype=dtype),
        criterion=nn.CrossEntropyLoss(),
        metrics={"accuracy": accuracy},
        work_dir=tmp_path,
        writers=(),
        device="cpu",
    )
    return runner.test()


@pytest.mark.parametrize("slow_evaluates", ["ema", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["exchange", "copy"])
def test_two_averages_leave_training_alone_and_each_follows_its_formula(
    tmp_path: Any, dtype: torch.dtype, slow_evaluates: str
) -> None:
    plain_runner, plain, _ = train(tmp_path / "plain", dtype, None, None)
    slow = SlowEMA(EMASettings(decay=0.95, warmup=False, evaluate=slow_evaluates))
    runner, rec, metrics = train(tmp_path / "two", dtype, {"decay": 0.8, "warmup": False}, slow)
    fast = runner.plugins["ema"]

    # the trained weights, at every iteration and at the end, are those of the run without
    assert len(rec.steps) == len(plain.steps) == 18
    for got, want in zip(rec.steps, plain.steps, strict=True):
        assert_same(got, want)
    trained = weights(runner.unwrapped_model)
    assert_same(trained, weights(plain_runner.unwrapped_model))

    # each average is the float64 formula over those weights, with its own decay
    averaged = {k for k, _ in runner.unwrapped_model.named_parameters()}
    averages = {}
    for plugin, decay in ((fast, 0.8), (slow, 0.95)):
        got = plugin.state_dict()["model"]
        for key, value in reference(rec, averaged, decay, warmup=False).items():
            assert relative_error(got[key], value) <= (1e-6 if dtype == torch.float32 else 4e-3)
        averages[plugin.name] = got
    assert (
        relative_error(averages["ema"]["0.weight"], averages["ema_slow"]["0.weight"].double())
        > 1e-3
    )

    # a checkpoint taken while both are swapped in holds the trained weights and each average
    saved = torch.load(tmp_path / "two" / "in_val.pt", weights_only=True)
    assert_same(dict(saved["model"]), trained)
    for name, average in averages.items():
        assert_same(dict(saved["plugins"][name]["model"]), average)

    # the test pass ran with an average: the last one swapped in (ema_slow), or with
    # evaluate: both, ema in the pass and ema_slow in its second pass
    if slow_evaluates == "ema":
        assert metrics == evaluate_alone(tmp_path / "alone", averages["ema_slow"], dtype)
    else:
        alone = {name: evaluate_alone(tmp_path / name, a, dtype) for name, a in averages.items()}
        assert metrics == {
            **alone["ema"],
            **{f"ema_slow/{k}": v for k, v in alone["ema_slow"].items()},
        }


def first_bn_stats(state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and unbiased variance, in float64, of what the first BatchNorm sees over the
    whole training set: the first Linear's outputs under ``state``'s weights."""
    x = classification_data(96, 0).tensors[0].double()
    h = x @ state["0.weight"].double().T + state["0.bias"].double()
    return h.mean(0), h.var(0)


def test_precise_bn_with_two_averages_recomputes_each_and_leaves_training_alone(
    tmp_path: Any,
) -> None:
    """precise_bn ``models: all`` (6 batches: the whole training set) recomputes the model's
    statistics on the trained weights and each average's on that average's weights."""
    pytest.importorskip("hookrun_precise_bn", reason="the EMA installed alone has no precise_bn")
    plain_runner, plain, _ = train(tmp_path / "plain", torch.float32, None, None, True)
    slow = SlowEMA(EMASettings(decay=0.95, warmup=False))
    ema = {"decay": 0.8, "warmup": False}
    runner, rec, _ = train(tmp_path / "two", torch.float32, ema, slow, True)
    for got, want in zip(rec.steps, plain.steps, strict=True):
        assert_same(got, want)
    trained = weights(runner.unwrapped_model)
    assert_same(trained, weights(plain_runner.unwrapped_model))
    states = {
        "model": trained,
        **{p.name: p.state_dict()["model"] for p in (runner.plugins["ema"], slow)},
    }
    for name, state in states.items():
        mean, var = first_bn_stats(state)
        assert relative_error(state["1.running_mean"], mean) <= 1e-5, name
        assert relative_error(state["1.running_var"], var) <= 1e-5, name
    assert (
        relative_error(states["ema"]["1.running_mean"], first_bn_stats(states["ema_slow"])[0])
        > 1e-3
    )

    # a recomputation while an average is swapped in (a pass called inside evaluation) still
    # gives the trained model statistics of its own weights, and each average of its own
    model = runner.unwrapped_model
    model[1].running_mean.zero_()
    slow.shadow.tensors[slow.shadow.slots["1.running_mean"]].zero_()
    with runner.plugins["ema"].swapped_in():
        runner.plugins["precise_bn"].recompute(runner)
    assert_same(weights(model), trained)
    assert_same(slow.state_dict()["model"], states["ema_slow"])
    assert_same(runner.plugins["ema"].state_dict()["model"], states["ema"])


class FailingValidation:
    """Raises in ``after_val_epoch`` (before both averages' ``after_val``) when armed."""

    priority = 10
    armed = False

    @hookimpl
    def after_val_epoch(self) -> None:
        if self.armed:
            raise RuntimeError("validation failed")


def test_raising_validation_with_two_averages_gives_back_the_trained_weights(tmp_path) -> None:
    slow, failing = SlowEMA(EMASettings(decay=0.95, warmup=False)), FailingValidation()
    ema = {"decay": 0.8, "warmup": False}
    runner, _, _ = train(tmp_path, torch.float32, ema, slow, extra=[failing])
    model, plugins = runner.unwrapped_model, (runner.plugins["ema"], slow)
    trained = weights(model)
    averages = [clones(p.state_dict()["model"]) for p in plugins]
    good = runner.val()
    failing.armed = True
    with pytest.raises(RuntimeError, match="validation failed"):
        runner.val()
    assert_same(weights(model), trained)
    for plugin, average in zip(plugins, averages, strict=True):
        assert_same(plugin.state_dict()["model"], average)
    failing.armed = False
    assert runner.val() == good

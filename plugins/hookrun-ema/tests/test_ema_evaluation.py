"""Validation and test run with the average; the trained weights always come back."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ema_testing import accuracy, bn_mlp, loader
from torch import nn

from hookrun import Runner, hookimpl


def make_runner(tmp_path, model: nn.Module, ema: dict | None, **kwargs: Any) -> Runner:
    dtype = next(model.parameters()).dtype
    options: dict[str, Any] = {"metrics": {"accuracy": accuracy}, **kwargs}
    return Runner(
        model,
        train_dataloader=loader(96, seed=0, shuffle=True, dtype=dtype),
        val_dataloader=loader(48, seed=1, shuffle=False, dtype=dtype),
        test_dataloader=loader(32, seed=2, shuffle=False, dtype=dtype),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=3,
        work_dir=tmp_path,
        writers=(),
        device="cpu",
        plugins={} if ema is None else {"ema": ema},
        **options,
    )


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def fresh_metrics(tmp_path, state: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple:
    """Metrics of a new model loaded with ``state``, evaluated without any plugin."""
    model = bn_mlp(dtype)
    torch.nn.init.zeros_(model[0].weight)  # nothing of the trained model survives
    model.load_state_dict(state)
    runner = make_runner(tmp_path / "fresh", model, None)
    return runner.val(), runner.test()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_metrics_equal_a_fresh_model_loaded_with_the_exported_average(tmp_path, dtype) -> None:
    model = bn_mlp(dtype)
    runner = make_runner(tmp_path, model, {"decay": 0.9})
    runner.train()
    path = runner.save_checkpoint(tmp_path / "final.pt")
    raw = weights(model)

    val, test = runner.val(), runner.test()
    exported = torch.load(path, weights_only=True)["plugins"]["ema"]["model"]
    assert exported["0.weight"].dtype == dtype
    assert (val, test) == fresh_metrics(tmp_path, exported, dtype)
    assert (val, test) != fresh_metrics(tmp_path, raw, dtype)  # the average is not the raw model
    assert runner.val() == val  # a second pass gives the same numbers
    assert_same(weights(model), raw)  # and the trained weights are back


def test_val_after_train_keeps_the_average(tmp_path) -> None:
    model = bn_mlp()
    runner = make_runner(tmp_path, model, {"decay": 0.9})
    runner.train()
    plugin = runner.plugins["ema"]
    before = weights_of(plugin.state_dict()["model"])
    updates = plugin.updates
    runner.val()
    runner.test()
    assert updates == 3 * 6
    assert plugin.updates == updates
    assert_same(weights_of(plugin.state_dict()["model"]), before)
    assert runner.last_metrics["val"] == runner.val()


def weights_of(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


def test_raising_validation_restores_the_trained_weights(tmp_path) -> None:
    model = bn_mlp()
    fail = {"now": False}

    def flaky_accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if fail["now"]:
            raise RuntimeError("metric failed")
        return accuracy(outputs, targets)

    runner = make_runner(tmp_path, model, {"decay": 0.9}, metrics={"accuracy": flaky_accuracy})
    runner.train()
    raw, average = weights(model), weights_of(runner.plugins["ema"].state_dict()["model"])
    good = runner.val()
    fail["now"] = True
    with pytest.raises(RuntimeError, match="metric failed"):
        runner.val()
    assert_same(weights(model), raw)
    assert_same(weights_of(runner.plugins["ema"].state_dict()["model"]), average)
    fail["now"] = False
    assert runner.val() == good


def test_evaluate_both_reports_raw_and_ema_metrics(tmp_path) -> None:
    """`both`: the pass with hooks uses the trained weights, `ema/<name>` the average."""
    model = bn_mlp()
    runner = make_runner(tmp_path, model, {"decay": 0.9, "evaluate": "both"})
    runner.train()
    exported = runner.plugins["ema"].state_dict()["model"]
    val, test = runner.val(), runner.test()
    raw_val, raw_test = fresh_metrics(tmp_path / "raw", weights(model), torch.float32)
    ema_val, ema_test = fresh_metrics(tmp_path / "ema", exported, torch.float32)
    assert val == {**raw_val, **{f"ema/{k}": v for k, v in ema_val.items()}}
    assert test == {**raw_test, **{f"ema/{k}": v for k, v in ema_test.items()}}
    assert set(runner.last_metrics["val"]) == {"loss", "accuracy", "ema/loss", "ema/accuracy"}


def test_evaluate_raw_leaves_the_model_alone(tmp_path) -> None:
    model = bn_mlp()
    runner = make_runner(tmp_path, model, {"decay": 0.9, "evaluate": "raw"})
    runner.train()
    assert runner.val() == fresh_metrics(tmp_path, weights(model), torch.float32)[0]


class SaveDuringValidation:
    """A best-checkpoint save, made while the average is swapped in."""

    priority = 90

    def __init__(self, path) -> None:
        self.path = path

    @hookimpl
    def after_val_epoch(self, runner) -> None:
        runner.save_checkpoint(self.path)


def test_checkpoint_saved_during_validation_holds_the_trained_weights(tmp_path) -> None:
    model = bn_mlp()
    runner = make_runner(
        tmp_path, model, {"decay": 0.9}, hooks=[SaveDuringValidation(tmp_path / "best.pt")]
    )
    runner.train()
    saved = torch.load(tmp_path / "best.pt", weights_only=True)
    assert_same(dict(saved["model"]), weights(model))
    assert_same(dict(saved["plugins"]["ema"]["model"]), runner.plugins["ema"].state_dict()["model"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["exchange", "copy"])
def test_extra_models_swaps_the_average_in_and_keeps_edits(tmp_path, dtype) -> None:
    """Another plugin (precise-BN) reaches the average through `extra_models` and may
    rewrite its BatchNorm statistics in place."""
    model = bn_mlp(dtype)
    runner = make_runner(tmp_path, model, {"decay": 0.9})
    runner.train()
    raw = weights(model)
    (found,) = runner.hooks.extra_models(runner=runner)
    with found["ema"]():
        assert_same(weights(model), runner.plugins["ema"].state_dict()["model"])
        model[1].running_mean.fill_(3.0)
    assert_same(weights(model), raw)
    edited = runner.plugins["ema"].state_dict()["model"]["1.running_mean"]
    assert torch.equal(edited, torch.full((8,), 3.0, dtype=dtype))

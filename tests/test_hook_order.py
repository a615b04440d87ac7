"""The call order of docs/hooks.md, recorded from a real run."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from hookrun import Runner, hookimpl
from hookrun.hooks.dispatch import hook_points
from hookrun.testing import forked, toy_data, toy_runner_kwargs

RECORDED = [h for h in hook_points() if h != "extra_models"]


class Recorder:
    """An ad-hoc hook object with every hook point, recording (hook, epoch, iter)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []


def _make(hook: str):
    def method(self, runner):
        self.calls.append((hook, runner.epoch, runner.iter))

    method.__name__ = hook
    return hookimpl(method)


for _hook in RECORDED:
    setattr(Recorder, _hook, _make(_hook))


def names(recorder: Recorder) -> list[str]:
    return [c[0] for c in recorder.calls]


STEP = ["before_backward", "after_backward", "before_optimizer_step", "after_optimizer_step"]


def expected_epoch_run(epochs: int, batches: int, val_batches: int) -> list[str]:
    """docs/hooks.md's order with grad_accum=1 and log_interval above the epoch length: the
    step's four hook points every iteration, a report at each epoch's last iteration."""
    seq = ["before_run", "before_train"]
    for _ in range(epochs):
        seq.append("before_train_epoch")
        for _ in range(batches):
            seq += ["transform_batch", "before_train_iter", *STEP, "after_train_iter"]
        seq += ["after_report", "after_train_epoch", "before_val", "before_val_epoch"]
        for _ in range(val_batches):
            seq += ["transform_batch", "before_val_iter", "after_val_iter"]
        seq += ["after_val_epoch", "after_val"]
    return seq + ["after_train", "after_run"]


def test_two_epochs_three_batches_two_val_batches(tmp_path):
    rec = Recorder()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[rec])).train()
    assert names(rec) == expected_epoch_run(2, 3, 2)


def test_counters_advance_after_the_after_hooks(tmp_path):
    rec = Recorder()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[rec])).train()
    iters = [(e, i) for h, e, i in rec.calls if h == "after_train_iter"]
    assert iters == [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]
    epochs = [(e, i) for h, e, i in rec.calls if h == "after_train_epoch"]
    assert epochs == [(0, 3), (1, 6)]


def test_val_interval_and_last_epoch(tmp_path):
    rec = Recorder()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[rec], max_epochs=5, val_interval=2)).train()
    val_epochs = [e for h, e, _ in rec.calls if h == "after_val_epoch"]
    assert val_epochs == [2, 4, 5]  # completed-epoch counts: after epochs 2, 4 and the last


class EpochQuestions:
    """Records what the epoch helpers answer at each epoch's end and its validation."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, bool, bool]] = []

    def note(self, hook: str, runner) -> None:
        self.answers.append((hook, runner.is_last_epoch(), runner.every_n_epochs(2)))

    @hookimpl
    def after_train_epoch(self, runner):
        self.note("after_train_epoch", runner)

    @hookimpl
    def after_val_epoch(self, runner):
        self.note("after_val_epoch", runner)


def test_epoch_helpers_answer_for_the_epoch_validated(tmp_path):
    """During validation inside training ``runner.epoch`` counts the epoch as done; the
    helpers still answer for it, as at its ``after_train_epoch``."""
    questions = EpochQuestions()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[questions], max_epochs=3)).train()
    last = [False, False, True]
    second = [False, True, False]
    assert questions.answers == [
        (hook, last[epoch], second[epoch])
        for epoch in range(3)
        for hook in ("after_train_epoch", "after_val_epoch")
    ]


def test_iteration_based_run(tmp_path):
    rec = Recorder()
    kwargs = toy_runner_kwargs(tmp_path, hooks=[rec], max_epochs=None, max_iters=7, val_interval=3)
    Runner(**kwargs).train()
    seq = names(rec)
    assert seq.count("after_train_iter") == 7
    assert seq.count("before_train_epoch") == 3  # passes of 3, 3 and 1 batches
    assert seq.count("after_train_epoch") == 3
    vals = [i for h, _, i in rec.calls if h == "after_val_epoch"]
    assert vals == [3, 6, 7]
    assert seq[-2:] == ["after_train", "after_run"]


def test_stop_training_ends_after_current_iteration(tmp_path):
    class Stopper:
        @hookimpl
        def after_train_iter(self, runner, batch_idx):
            if runner.iter == 4:
                runner.stop_training = True

    rec = Recorder()
    Runner(**toy_runner_kwargs(tmp_path, hooks=[Stopper(), rec], max_epochs=5)).train()
    seq = names(rec)
    assert seq.count("after_train_iter") == 5
    assert seq[-4:] == ["after_train_iter", "after_train_epoch", "after_train", "after_run"]


@pytest.mark.parametrize(("val_interval", "validated"), [(1, [1, 2]), (2, [2]), (3, [])])
def test_stop_at_an_epoch_end_still_validates_that_epoch_when_due(
    tmp_path, val_interval, validated
):
    """docs/hooks.md: an epoch stopped at its end (in ``after_train_epoch``) is validated when its
    validation was due, as Lightning and MMEngine do; then training ends."""

    class StopAfterSecondEpoch:
        @hookimpl
        def after_train_epoch(self, runner):
            runner.stop_training = runner.epoch == 1

    rec = Recorder()
    kwargs = toy_runner_kwargs(tmp_path, hooks=[StopAfterSecondEpoch(), rec], max_epochs=5,
                               val_interval=val_interval)  # fmt: skip
    Runner(**kwargs).train()
    assert [epoch for h, epoch, _ in rec.calls if h == "after_val_epoch"] == validated
    assert names(rec).count("after_train_epoch") == 2
    assert names(rec)[-2:] == ["after_train", "after_run"]


def test_on_exception_then_same_exception_propagates(tmp_path):
    boom = RuntimeError("boom")

    class Fails:
        @hookimpl
        def after_train_iter(self, runner):
            if runner.iter == 1:
                raise boom

    rec = Recorder()
    with pytest.raises(RuntimeError) as info:
        Runner(**toy_runner_kwargs(tmp_path, hooks=[Fails(), rec])).train()
    assert info.value is boom
    assert names(rec)[-1] == "on_exception"
    assert "after_run" not in names(rec)


def test_val_and_test_alone(tmp_path):
    rec = Recorder()
    runner = Runner(
        **toy_runner_kwargs(tmp_path, hooks=[rec], test_dataloader=toy_data(4, 4, False))
    )
    runner.val()
    runner.test()
    assert names(rec) == [
        "before_run", "before_val", "before_val_epoch",
        "transform_batch", "before_val_iter", "after_val_iter",
        "transform_batch", "before_val_iter", "after_val_iter",
        "after_val_epoch", "after_val", "after_run",
        "before_run", "before_test", "before_test_epoch",
        "transform_batch", "before_test_iter", "after_test_iter",
        "after_test_epoch", "after_test", "after_run",
    ]  # fmt: skip


def test_outputs_hold_detached_losses_with_loss_first(tmp_path):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, batch):
            x, y = batch
            ce = torch.nn.functional.cross_entropy(self.lin(x), y)
            reg = self.lin.weight.pow(2).sum() * 1e-3
            return {"ce": ce, "reg": reg, "loss": ce + reg}

        def validation_step(self, batch):
            return {"acc": (self.lin(batch[0]).argmax(1) == batch[1]).float().mean()}

    seen = []

    class Grab:
        @hookimpl
        def after_train_iter(self, outputs):
            seen.append(outputs)

    model = Model()
    runner = Runner(
        model,
        toy_data(),
        toy_data(8, 4, False),
        optimizer=torch.optim.SGD(model.parameters(), 0.1),
        max_epochs=1,
        hooks=[Grab()],
        writers=(),
        work_dir=tmp_path,
    )
    runner.train()
    assert list(seen[0]) == ["loss", "ce", "reg"]
    assert all(not v.requires_grad for v in seen[0].values())
    assert torch.allclose(seen[0]["loss"], seen[0]["ce"] + seen[0]["reg"])
    assert set(runner.last_metrics["val"]) == {"acc"}


def test_every_val_and_test_hook_sees_eval_mode_and_training_hooks_train_mode(tmp_path):
    modes: list[tuple[str, bool]] = []

    def _mode(hook: str):
        def method(self, runner):
            modes.append((hook, runner.unwrapped_model.training))

        method.__name__ = hook
        return hookimpl(method)

    watched = [h for h in RECORDED if "_val" in h or "_test" in h or "train" in h]
    Watcher = type("Watcher", (), {h: _mode(h) for h in watched})
    runner = Runner(
        **toy_runner_kwargs(tmp_path, hooks=[Watcher()], test_dataloader=toy_data(8, 4, False))
    )
    runner.train()
    runner.val()
    runner.test()
    evaluation = [m for h, m in modes if "_val" in h or "_test" in h]
    training = [m for h, m in modes if "train" in h and h not in ("before_train", "after_train")]
    assert len(evaluation) == 2 * 8 + 8 + 8  # two validations in train(), val(), test()
    assert not any(evaluation)
    assert all(training) and len(training) == 2 * (2 + 2 * 3)


THIRD_PARTY = """
from hookrun import Plugin, hookimpl

CALLS = []

class Alpha(Plugin):
    name = "order_alpha"

    @hookimpl(trylast=True)
    def before_train(self):
        CALLS.append("order_alpha")

class Beta(Plugin):
    name = "order_beta"

    @hookimpl(tryfirst=True)
    def before_train(self):
        CALLS.append("order_beta")

class Gamma(Plugin):
    name = "order_gamma"
    priority = 90

    @hookimpl(wrapper=True)
    def before_train(self):
        CALLS.append("order_gamma")
        return (yield)

class Delta(Plugin):
    name = "order_delta"
    priority = "HIGH"

    @hookimpl(trylast=True)
    def before_train(self):
        CALLS.append("order_delta")
"""


def test_plugins_list_load_shows_the_order_a_run_calls(make_dist, tmp_path):
    """Third-party plugins with priorities, tryfirst/trylast and a wrapper: the call order
    ``hookrun plugins list --load`` prints is the order a real run's dispatch calls."""
    names = {
        f"order_{n}": f"order_plugins:{n.title()}" for n in ("alpha", "beta", "gamma", "delta")
    }
    site = make_dist("hookrun-order", "order_plugins", THIRD_PARTY, {"hookrun.plugins": names})
    module = importlib.import_module("order_plugins")
    plugins = dict.fromkeys(names, True)
    Runner(**toy_runner_kwargs(tmp_path, plugins=plugins, max_epochs=1)).train()
    called = list(module.CALLS)

    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKRUN_")}
    listed = forked.run(
        [sys.executable, "-m", "hookrun", "plugins", "list", "--load"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(site)},
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if line.startswith("before_train ")]
    shown = [entry.split(" (")[0] for entry in row.split(None, 1)[1].split(", ")]
    # the wrapper outermost; within priority 50 the tryfirst plugin first, although by name
    # (the registration order) it comes second
    assert called == ["order_gamma", "order_delta", "order_beta", "order_alpha"]
    assert [name for name in shown if name in names] == called

"""Several named validation sets, validation every N iterations of an epoch run, and the
debugging limits, through the Python API (the CLI's ``--smoke`` is tests/test_smoke.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import ConfigError, Runner, hookimpl
from hookrun.testing import (
    RaiseAt,
    assert_same_checkpoint,
    jsonl_series,
    load_checkpoint,
    resume_job,
    run_cli,
    run_ranks,
    toy_data,
    toy_runner_kwargs,
    train_reference,
)
from jobs import val_sets_job

JOBS = Path(__file__).parent / "jobs"

# -- several named sets --------------------------------------------------------------------


def hand_metrics(model: nn.Module, loader: DataLoader) -> dict[str, float]:
    """Loss and accuracy over every sample of ``loader``, computed without hookrun."""
    x = torch.cat([b[0] for b in loader])
    y = torch.cat([b[1] for b in loader])
    with torch.no_grad():
        out = model(x)
    return {
        "loss": nn.functional.cross_entropy(out, y).item(),
        "accuracy": (out.argmax(1) == y).float().mean().item(),
    }


def test_two_named_sets_report_each_sets_metrics(tmp_path: Path) -> None:
    sets = {
        "id": toy_data(8, 4, shuffle=False, seed=1),
        "ood": toy_data(6, 4, shuffle=False, seed=7),
    }
    seen: list[dict[str, float]] = []

    class Seen:
        @hookimpl
        def after_val_epoch(self, metrics: dict[str, float]) -> None:
            seen.append(dict(metrics))

    kwargs = toy_runner_kwargs(tmp_path, val_dataloader=sets, hooks=[Seen()], writers=["jsonl"])
    runner = Runner(**kwargs)
    runner.train()
    assert len(seen) == 2  # one validation per epoch, both sets in it
    expected = {
        f"{name}/{key}": value
        for name, loader in sets.items()
        for key, value in hand_metrics(runner.unwrapped_model, loader).items()
    }
    assert set(seen[-1]) == set(expected)
    for key, value in expected.items():
        assert seen[-1][key] == pytest.approx(value, abs=1e-6), key
    assert runner.last_metrics["val"] == seen[-1]
    assert runner.val() == pytest.approx(expected, abs=1e-6)
    log = runner.work_dir / "log.jsonl"
    for key, value in expected.items():
        assert jsonl_series(log, f"val/{key}")[-1] == (6, pytest.approx(value, abs=1e-6))
    assert jsonl_series(log, "val/accuracy") == []


def test_one_loader_keeps_todays_names(make_toy_runner: Any) -> None:
    runner = make_toy_runner()
    runner.train()
    assert set(runner.last_metrics["val"]) == {"loss", "accuracy"}


def test_a_mapping_without_names_is_one_line(make_toy_runner: Any) -> None:
    with pytest.raises(ConfigError, match=r"val_dataloader: a mapping of validation sets"):
        make_toy_runner(val_dataloader={})
    with pytest.raises(ConfigError, match=r"named by a non-empty string"):
        make_toy_runner(val_dataloader={"": toy_data(4, 4)})


def test_ema_evaluates_each_named_set(tmp_path: Path) -> None:
    sets = {
        "id": toy_data(8, 4, shuffle=False, seed=1),
        "ood": toy_data(6, 4, shuffle=False, seed=7),
    }
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path, val_dataloader=sets, plugins={"ema": {"decay": 0.5, "evaluate": "both"}}
        )
    )
    runner.train()
    metrics = runner.last_metrics["val"]
    with runner.extra_models()["ema"]():
        for name, loader in sets.items():
            for key, value in hand_metrics(runner.unwrapped_model, loader).items():
                assert metrics[f"ema/{name}/{key}"] == pytest.approx(value, abs=1e-6)
    for name, loader in sets.items():  # the trained weights, back in place
        for key, value in hand_metrics(runner.unwrapped_model, loader).items():
            assert metrics[f"{name}/{key}"] == pytest.approx(value, abs=1e-6)


class Scripted(nn.Module):
    """Predicts class 1 for samples whose second feature exceeds a threshold the script sets
    per epoch and per set (the first feature's sign tells the sets apart): accuracies
    follow ``SCRIPT`` exactly, whatever the trained weights."""

    SCRIPT = {"id": [0.8, -0.8, 0.0, 0.4], "ood": [0.8, 0.4, -0.8, 0.0]}

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("epoch", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = int(self.epoch)
        cut = torch.where(x[:, 0] > 0, self.SCRIPT["id"][e], self.SCRIPT["ood"][e])
        score = x[:, 1] - cut
        return torch.stack([-score, score], 1) + 0 * self.linear(x)


class FollowEpoch:
    @hookimpl
    def before_val(self, runner: Any) -> None:
        runner.unwrapped_model.epoch.fill_(runner.position.epoch)


def scripted_sets() -> dict[str, DataLoader]:
    second = torch.linspace(-1, 1, 11)
    sets = {}
    for name, sign in (("id", 1.0), ("ood", -1.0)):
        x = torch.zeros(11, 4)
        x[:, 0], x[:, 1] = sign, second
        sets[name] = DataLoader(TensorDataset(x, torch.ones(11, dtype=torch.long)), batch_size=4)
    return sets


def scripted_runner(tmp_path: Path, plugins: dict[str, Any]) -> Runner:
    model = Scripted()
    return Runner(
        **toy_runner_kwargs(
            tmp_path,
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            val_dataloader=scripted_sets(),
            max_epochs=4,
            hooks=[FollowEpoch()],
            plugins=plugins,
        )
    )


def test_save_best_keeps_the_epoch_best_on_the_named_set(tmp_path: Path) -> None:
    accuracies = {
        name: [((torch.linspace(-1, 1, 11) > cut).float().mean().item()) for cut in cuts]
        for name, cuts in Scripted.SCRIPT.items()
    }
    best = {name: max(range(4), key=values.__getitem__) for name, values in accuracies.items()}
    assert best["id"] != best["ood"]  # the script makes the sets disagree
    runner = scripted_runner(
        tmp_path, {"checkpoint": {"save_best": ["ood/accuracy", "id/accuracy"]}}
    )
    runner.train()
    for name in ("id", "ood"):
        saved = load_checkpoint(runner.checkpoint_dir / f"best_{name}_accuracy.pt")
        assert saved["loop"]["epoch"] == best[name], name
        record = runner.plugins["checkpoint"].best[f"{name}/accuracy"]
        assert record["score"] == pytest.approx(accuracies[name][best[name]])


def test_early_stopping_watches_a_named_set(tmp_path: Path) -> None:
    runner = scripted_runner(
        tmp_path, {"early_stopping": {"monitor": "ood/accuracy", "patience": 1}}
    )
    runner.train()
    # ood's accuracy rises through the 3rd epoch and falls in the 4th: with patience 1 training
    # stops after the 4th; id's falls in the 3rd, which would have stopped it one epoch early
    assert runner.plugins["early_stopping"].stopped_epoch == 4
    assert runner.last_metrics["val"]["ood/accuracy"] < runner.plugins["early_stopping"].best


# -- validation every N iterations of an epoch run -----------------------------------------


class SaveAfterVal:
    """Ad-hoc hook: records the iterations each validation followed and saves
    ``val_iter_<n>.pt`` right after it (``after_val_epoch``)."""

    def __init__(self) -> None:
        self.iters: list[int] = []

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        self.iters.append(runner.position.iter)
        runner.save_checkpoint(runner.checkpoint_dir / f"val_iter_{runner.position.iter}.pt")


def log_rows(work_dir: Path) -> list[dict[str, Any]]:
    """The JSONL log's scalar rows without their wall-clock values (a config row is written
    by each start of a run)."""
    rows = [json.loads(line) for line in (work_dir / "log.jsonl").read_text().splitlines()]
    drop = ("time", "train/eta", "train/time")
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows if "step" in r]


def test_val_every_n_iters_validates_at_its_iterations_and_resumes_exactly(tmp_path: Path) -> None:
    # 3 epochs of 7 batches: every 5 iterations, and once more after the 21st; none at epoch ends
    recorder = SaveAfterVal()
    reference = train_reference(
        tmp_path / "reference", save_every=0, val_every_n_iters=5, hooks=[recorder]
    )
    assert recorder.iters == [5, 10, 15, 20, 21]
    saved = load_checkpoint(tmp_path / "reference" / "checkpoints" / "val_iter_10.pt")
    assert saved["loop"] == {
        "epoch": 1,
        "batch": 3,
        "phase": "validated",
        "iter": 10,
        "optimizer_steps": {"main": 10},
    }
    assert saved["meta"]["epoch"] == 1  # epochs done: the second is under way
    crashed = tmp_path / "crashed"
    threads = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match="RaiseAt"):
            resume_job(
                crashed, save_every=0, val_every_n_iters=5, hooks=[SaveAfterVal(), RaiseAt(13)]
            )
        for name in ("val_iter_5.pt", "val_iter_10.pt"):  # resume from the one at iteration 10
            assert (crashed / "checkpoints" / name).exists()
        (crashed / "checkpoints" / "val_iter_5.pt").unlink()
        resumed = SaveAfterVal()
        resume_job(crashed, resume=True, save_every=0, val_every_n_iters=5, hooks=[resumed])
    finally:
        torch.set_num_threads(threads)
    assert resumed.iters == [15, 20, 21]
    assert_same_checkpoint(reference, crashed / "final.pt")
    assert log_rows(crashed) == log_rows(tmp_path / "reference")


def test_val_every_n_iters_is_for_epoch_runs(make_toy_runner: Any) -> None:
    with pytest.raises(ConfigError, match=r"runner.val_every_n_iters: .*for epoch runs"):
        make_toy_runner(max_epochs=None, max_iters=6, val_every_n_iters=2)


def test_named_sets_on_two_ranks_count_each_sample_once(tmp_path: Path) -> None:
    outputs = run_ranks(JOBS / "val_sets_job.py", tmp_path / "run", path=[JOBS])
    assert "iterations 4" in outputs[0]  # 2 epochs of 2 batches per rank
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    model = nn.Linear(4, 2)
    model.load_state_dict(torch.load(tmp_path / "run" / "model.pt", weights_only=True))
    for name, loader in val_sets_job.sets().items():
        for key, value in hand_metrics(model, loader).items():
            assert metrics[f"{name}/{key}"] == pytest.approx(value, abs=1e-6), (name, key)


SETS_TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 4, generator=g), torch.randint(0, 2, (24,), generator=g)
    model = nn.Linear(4, 2)
    return {
        "model": model,
        "train_dataloader": DataLoader(TensorDataset(x[:16], y[:16]), batch_size=4),
        "val_dataloader": {
            "id": DataLoader(TensorDataset(x[:8], y[:8]), batch_size=4),
            "ood": DataLoader(TensorDataset(x[16:], y[16:]), batch_size=4),
        },
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
    }
"""


def test_a_task_returns_named_sets_and_the_config_watches_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "setstask.py").write_text(SETS_TASK)
    config = tmp_path / "sets.yaml"
    config.write_text(
        "task: setstask.py:build\n"
        "runner: {max_epochs: 2, device: cpu, writers: [jsonl]}\n"
        "plugins: {checkpoint: {save_best: ood/accuracy}, logger: false, timer: false}\n"
    )
    code, out, err = run_cli(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert code == 0, err
    log = tmp_path / "run" / "log.jsonl"
    assert [step for step, _ in jsonl_series(log, "val/ood/accuracy")] == [4, 8]
    assert [step for step, _ in jsonl_series(log, "val/id/loss")] == [4, 8]
    assert (tmp_path / "run" / "checkpoints" / "best_ood_accuracy.pt").exists()

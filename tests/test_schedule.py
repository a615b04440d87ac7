"""Optimizer and learning-rate schedule declared in the config, and ``hookrun schedule``: the
rates it prints are the ones the run then logs, iteration for iteration."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from hookrun.config import file as cfg
from hookrun.config.optimizers import build_optimizer
from hookrun.config.schedule import compute
from hookrun.config.schedulers import build_scheduler, run_length
from hookrun.errors import ConfigError
from hookrun.testing import forked, isolated_env, jsonl_series, run_cli, write_toy_task

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

SCHEDULED = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {max_epochs: 3, device: cpu, writers: [jsonl], log_interval: 1}
optimizer: {type: SGD, lr: 0.1, momentum: 0.9, weight_decay: 0.01, no_decay: true}
scheduler:
  warmup: {iters: 3, start_factor: 0.1}
  main: {type: CosineAnnealingLR, T_max: auto, eta_min: 0.001}
  interval: iter
plugins: {checkpoint: false, logger: false, timer: false}
"""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)


def test_param_groups_by_pattern_and_no_decay():
    model = Net()
    optimizer = build_optimizer(
        model,
        {
            "type": "torch.optim.AdamW",  # a dotted path works as well as a name
            "lr": 0.01,
            "weight_decay": 0.05,
            "no_decay": True,
            "param_groups": [{"params": "head.*", "lr": 0.1}],
        },
    )
    assert isinstance(optimizer, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [
        (sorted(names[id(p)] for p in g["params"]), g["lr"], g["weight_decay"])
        for g in optimizer.param_groups
    ]
    assert groups == [
        (["body.weight"], 0.01, 0.05),
        (["body.bias", "norm.bias", "norm.weight"], 0.01, 0.0),
        (["head.weight"], 0.1, 0.05),
        (["head.bias"], 0.1, 0.0),
    ]
    with pytest.raises(ConfigError) as err:
        build_optimizer(model, {"type": "SGD", "lr": 1, "param_groups": [{"params": "tail.*"}]})
    assert err.value.lines == [
        "optimizer.param_groups.0.params: 'tail.*' matches no trainable parameter"
    ]


def reference_lr(step: int, base: float, warm: int, start: float, total: int, eta: float) -> float:
    """Linear warm-up then cosine annealing, from their formulas (not torch's classes)."""
    if step < warm:
        return base * (start + (1 - start) * step / warm)
    t = step - warm
    return eta + (base - eta) * (1 + math.cos(math.pi * t / (total - warm))) / 2


def test_warmup_then_cosine_follows_the_formulas_with_auto_length():
    model = nn.Linear(2, 2)
    optimizer = build_optimizer(model, {"type": "SGD", "lr": 0.5})
    length = run_length(batches_per_epoch=7, max_epochs=4, max_iters=None, grad_accum=2)
    assert (length.optimizer_steps_per_epoch, length.optimizer_steps) == (4, 16)
    section = {
        "warmup": {"epochs": 1, "start_factor": 0.2},
        "main": {"type": "CosineAnnealingLR", "T_max": "auto", "eta_min": 0.01},
    }
    scheduler = build_scheduler(optimizer, section, length, "iter")
    seen = []
    for _ in range(16):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [reference_lr(s, 0.5, 4, 0.2, 16, 0.01) for s in range(16)]
    assert seen == pytest.approx(expected, rel=1e-9, abs=1e-12)
    with pytest.raises(ConfigError, match=r"^scheduler.warmup: 16 warm-up steps leave nothing"):
        build_scheduler(optimizer, {**section, "warmup": {"iters": 16}}, length, "iter")


def test_schedule_command_matches_the_lrs_the_run_logs(tmp_path, capsys):
    config = write_toy_task(tmp_path, SCHEDULED)
    code, out, err = run_cli(capsys, "schedule", config, "--json")
    assert code == 0, err
    planned = json.loads(out)
    code, out, _ = run_cli(capsys, "schedule", config)
    assert "12 iterations; the schedule steps per iter" in out
    assert out.splitlines()[1].split() == ["iter", "epoch", "lr", "momentum"]

    work = tmp_path / "run"
    code, trained, err = run_cli(capsys, "train", config, "--work-dir", work)
    assert code == 0, err
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["train/lr"] for r in records if "train/lr" in r}
    assert sorted(logged) == list(range(1, 13))  # 3 epochs x 4 batches, every iteration
    assert [p["iter"] for p in planned] == sorted(logged)
    assert [p["lr"][0] for p in planned] == [logged[i] for i in sorted(logged)]  # exact
    assert planned[0]["lr"] == [pytest.approx(0.01)] * 2  # warm-up from 0.1 x 0.1, 2 groups
    assert {m for p in planned for m in p["momentum"]} == {0.9}
    # "TensorBoard:" is not printed: only the writers that ran are listed
    assert "JSONL log:" in trained and "TensorBoard" not in trained


def test_schedule_of_the_digits_example_fills_auto_from_the_run(tmp_path):
    digits = Path(__file__).resolve().parent.parent / "examples/digits/config.yaml"
    loaded = cfg.load(digits, ["task_args.num_threads=null"])  # keep this process's threads
    steps = compute(loaded)
    assert len(steps) == 15 * 20  # 15 epochs of 20 batches, one schedule step per batch
    lrs = [s.lrs[0] for s in steps]
    assert lrs[0] == pytest.approx(0.0003) and max(lrs) == pytest.approx(0.003)
    assert lrs.index(max(lrs)) == 20  # one epoch of warm-up
    assert lrs[-1] < 1e-6  # the cosine ends near zero at the run's last iteration


def test_plot_writes_a_png_or_names_the_missing_extra(tmp_path, capsys, monkeypatch):
    config = write_toy_task(tmp_path, SCHEDULED)
    png = tmp_path / "lr.png"
    with monkeypatch.context() as blocked:
        blocked.setitem(sys.modules, "matplotlib", None)  # Python's "not installed"
        assert run_cli(capsys, "schedule", config, "--plot", png) == (
            2,
            "",
            "--plot: needs matplotlib, which is not installed; pip install matplotlib\n",
        )
    pytest.importorskip("matplotlib")
    code, out, err = run_cli(capsys, "schedule", config, "--plot", png)
    assert code == 0, err
    assert out.splitlines()[-1] == f"wrote {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


DIGITS_LIKE = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {max_epochs: 3, device: cpu, writers: [jsonl], log_interval: 1, seed: 0}
optimizer: {type: AdamW, lr: 0.003, weight_decay: 1.0e-4, no_decay: true}
scheduler:
  warmup: {epochs: 1, start_factor: 0.1}
  main: {type: CosineAnnealingLR, T_max: MAX}
  interval: iter
plugins: {checkpoint: {interval: 1}, logger: false, timer: false}
"""


def hookrun(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``hookrun`` CLI in a process of its own."""
    command = [sys.executable, "-m", "hookrun", *map(str, args)]
    done = forked.run(
        command, cwd=cwd, env=isolated_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_longer_run_resumed_follows_the_longer_schedule(tmp_path, capsys, monkeypatch):
    """The digits example's schedule (a warm-up epoch, then a cosine over ``T_max: auto``)
    trained for 3 epochs, then resumed by the ``hookrun`` command with ``max_epochs=5``:
    every iteration after the resume logs the rate ``hookrun schedule`` gives for the
    5-epoch run, down to its end."""
    monkeypatch.chdir(tmp_path)
    config = write_toy_task(tmp_path, DIGITS_LIKE.replace("MAX", "auto"))
    code, _, err = run_cli(capsys, "train", config, "--work-dir", "run")
    assert code == 0, err
    longer = hookrun(
        "train",
        config,
        "--work-dir",
        "run",
        "--resume",
        "auto",
        "--set",
        "runner.max_epochs=5",
        cwd=tmp_path,
    )
    assert "continues at step 12 of this run's schedule" in longer.stdout + longer.stderr
    code, out, err = run_cli(capsys, "schedule", config, "--set", "runner.max_epochs=5", "--json")
    planned = json.loads(out)
    assert len(planned) == 20  # 5 epochs of 4 batches
    logged = dict(jsonl_series(tmp_path / "run" / "log.jsonl", "train/lr"))
    after = {step: lr for step, lr in logged.items() if step > 12}
    assert sorted(after) == list(range(13, 21))
    for row in planned[12:]:
        assert after[row["iter"]] == pytest.approx(row["lr"][0], rel=1e-6), row["iter"]
    # the cosine decays to its minimum at the longer run's end; from 3 epochs' near-zero end
    # the longer cosine stands higher at step 13
    assert after[20] == pytest.approx(min(row["lr"][0] for row in planned), rel=1e-6)
    assert after[20] < after[13] and logged[12] < after[13]


def test_an_explicit_length_stays_as_written_on_resume(tmp_path, capsys):
    """``T_max: 8`` is the user's number: a longer run keeps it (torch's cosine rises again
    after it), loaded exactly from the checkpoint; ``hookrun schedule`` shows the same."""
    config = write_toy_task(tmp_path, DIGITS_LIKE.replace("MAX", "8"))
    work = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", config, "--work-dir", work)
    assert code == 0, err
    code, out, err = run_cli(
        capsys,
        "train",
        config,
        "--work-dir",
        work,
        "--resume",
        "auto",
        "--set",
        "runner.max_epochs=5",
    )
    assert code == 0, err
    assert "schedule differs" not in out + err
    code, out, err = run_cli(capsys, "schedule", config, "--set", "runner.max_epochs=5", "--json")
    planned = {row["iter"]: row["lr"][0] for row in json.loads(out)}
    logged = dict(jsonl_series(work / "log.jsonl", "train/lr"))
    assert sorted(logged) == list(range(1, 21))
    assert logged == planned  # exact: the same schedule, stepped the same way
    assert logged[20] > logged[16]  # past T_max = 8 steps after the warm-up: rising again


def test_a_longer_run_resumed_mid_epoch_with_accumulation(tmp_path, capsys):
    """Groups of 3 batches in epochs of 4 (a schedule step at batches 3 and 4): a checkpoint
    taken mid-epoch, resumed with ``max_epochs=5``, continues at the schedule step its
    position represents and logs what ``hookrun schedule`` gives for the 5-epoch run."""
    text = DIGITS_LIKE.replace("MAX", "auto").replace("seed: 0}", "seed: 0, grad_accum: 3}")
    config = write_toy_task(
        tmp_path, text.replace("{interval: 1}", "{interval: 7, by_epoch: false}")
    )
    code, _, err = run_cli(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert code == 0, err
    checkpoint = tmp_path / "run" / "checkpoints" / "iter_7.pt"  # epoch 2, after 3 batches
    longer = ["--set", "runner.max_epochs=5"]
    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", tmp_path / "again", "--resume", checkpoint, *longer
    )
    assert code == 0, err
    assert "continues at step 3 of this run's schedule" in out + err  # 2 + 1 groups
    code, out, err = run_cli(capsys, "schedule", config, *longer, "--json")
    planned = {row["iter"]: row["lr"][0] for row in json.loads(out)}
    logged = dict(jsonl_series(tmp_path / "again" / "log.jsonl", "train/lr"))
    assert sorted(logged) == list(range(8, 21))
    assert logged == pytest.approx({i: planned[i] for i in logged}, rel=1e-6)
    assert logged[20] == pytest.approx(min(planned.values()), rel=1e-6)


ONE_CYCLE = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {max_epochs: 3, device: cpu, writers: [jsonl], log_interval: 1, seed: 0}
optimizer: {type: SGD, lr: 0.01, momentum: 0.9}
scheduler:
  main: {type: OneCycleLR, max_lr: 0.1, total_steps: auto}
  interval: iter
plugins: {checkpoint: {interval: 1}, logger: false, timer: false}
"""


def test_a_changed_one_cycle_peak_is_this_runs_on_resume(tmp_path, capsys):
    """``OneCycleLR`` keeps its peak and floor in the optimizer's parameter groups, which a
    checkpoint restores: resumed with ``max_lr: 0.3`` (and a longer run), every iteration
    after the resume logs the rate ``hookrun schedule`` gives for the changed config, not a
    schedule built on the checkpoint's ``max_lr: 0.1``."""
    config = write_toy_task(tmp_path, ONE_CYCLE)
    work = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", config, "--work-dir", work)
    assert code == 0, err
    changed = ["--set", "scheduler.main.max_lr=0.3", "--set", "runner.max_epochs=5"]
    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", work, "--resume", "auto", *changed
    )
    assert code == 0, err
    assert "continues at step 12 of this run's schedule" in out + err
    code, out, err = run_cli(capsys, "schedule", config, *changed, "--json")
    planned = {row["iter"]: row["lr"][0] for row in json.loads(out)}
    logged = dict(jsonl_series(work / "log.jsonl", "train/lr"))
    after = {step: lr for step, lr in logged.items() if step > 12}
    assert sorted(after) == list(range(13, 21))
    assert after == pytest.approx({step: planned[step] for step in after}, rel=1e-6)
    assert max(planned.values()) == pytest.approx(0.3, rel=1e-6)

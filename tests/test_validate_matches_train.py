"""``hookrun config validate`` refuses what ``hookrun train`` refuses from the config alone,
with the same line and exit code 2; what needs the task (batches an epoch, the model's
parameter groups) only ``train`` can tell, and ``validate --help`` says so. Both commands run
through the CLI's ``main`` in this process (``run_cli``); test_cli checks their exit codes
in real processes."""

from __future__ import annotations

import pytest

from hookrun.testing import run_cli, write_toy_task

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

SCHEDULED = """
task: toytask.py:build
task_args: {optimizer: false}
runner: {max_epochs: 3, device: cpu, writers: [jsonl]}
optimizer: {type: SGD, lr: 0.1}
scheduler:
  warmup: {iters: 2}
  main: {type: MultiStepLR, milestones: [3, 6]}
  interval: iter
plugins: {checkpoint: false, logger: false, timer: false}
"""

CASES = {
    "iters-under-epoch": (
        ["scheduler.interval=epoch"],
        "scheduler.warmup.iters: an epoch-wise schedule warms up in epochs "
        "(use warmup.epochs, or interval: iter)",
    ),
    "epochs-whole-run": (
        ["scheduler.warmup={epochs: 3, iters: null}"],
        "scheduler.warmup.epochs: 3 warm-up epochs leave nothing of the run's 3 epochs",
    ),
    "default-epochs-whole-run": (
        ["runner.max_epochs=null", "scheduler.warmup={epochs: 10, iters: null}"],
        "scheduler.warmup.epochs: 10 warm-up epochs leave nothing of the run's 10 epochs",
    ),
    "iters-whole-run": (
        ["runner.max_epochs=null", "runner.max_iters=6", "scheduler.warmup.iters=6"],
        "scheduler.warmup.iters: 6 warm-up iterations leave nothing of the run's 6 iterations",
    ),
    "main-values": (
        ["scheduler.main.milestones=5"],
        "scheduler.main: MultiStepLR refuses these values: 'int' object is not iterable",
    ),
    "main-values-with-auto": (
        ["scheduler.main={type: OneCycleLR, max_lr: 0.2, total_steps: auto, pct_start: 2}"],
        "scheduler.main: OneCycleLR refuses these values: Expected float between 0 and 1 "
        "pct_start, but got 2",
    ),
    "fp16-on-cpu": (
        ["runner.amp=fp16"],
        "runner.amp: 'fp16' needs a CUDA device; use 'bf16' on CPU",
    ),
    "sync-bn-on-cpu": (
        ["runner.sync_bn=true"],
        "runner.sync_bn: SyncBatchNorm needs CUDA (device is cpu)",
    ),
}


def sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


@pytest.mark.parametrize("case", list(CASES))
def test_validate_refuses_what_train_refuses_with_the_same_line(tmp_path, capsys, case):
    overrides, line = CASES[case]
    config = write_toy_task(tmp_path, SCHEDULED)
    work = tmp_path / "run"
    code, out, err = run_cli(capsys, "config", "validate", config, *sets(overrides))
    assert (code, out, err.splitlines()) == (2, "", [line])
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work, *sets(overrides))
    assert code == 2
    assert err.splitlines()[-1] == line  # after the "building task ..." notice
    assert not work.exists()  # nothing created


def test_what_needs_the_task_is_trains_and_the_help_says_so(tmp_path, capsys):
    # 3 epochs of 4 batches: a warm-up of 12 steps is the whole run, which only the task's
    # train_dataloader tells
    config = write_toy_task(tmp_path, SCHEDULED)
    code, out, _ = run_cli(
        capsys, "config", "validate", config, "--set", "scheduler.warmup.iters=12"
    )
    assert code == 0 and "valid" in out
    work = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "train", config, "--work-dir", work, "--set", "scheduler.warmup.iters=12"
    )
    assert code == 2
    assert err.splitlines()[-1] == (
        "scheduler.warmup: 12 warm-up steps leave nothing of the run's 12 optimizer steps"
    )
    code, out, _ = run_cli(capsys, "config", "validate", "--help")
    assert code == 0
    assert "batches an epoch" in " ".join(out.split())


def test_a_per_group_list_is_checked_against_the_models_groups_by_train(tmp_path, capsys):
    one_cycle = "scheduler.main={type: OneCycleLR, max_lr: [0.1, 0.2], total_steps: auto}"
    config = write_toy_task(tmp_path, SCHEDULED)
    code, out, _ = run_cli(capsys, "config", "validate", config, "--set", one_cycle)
    assert code == 0 and "valid" in out
    code, _, err = run_cli(
        capsys, "train", config, "--work-dir", tmp_path / "run", "--set", one_cycle
    )
    assert code == 2
    assert err.splitlines()[-1].startswith(
        "scheduler.main: OneCycleLR refuses these values: max_lr must have the same length "
        "as optimizer.param_groups. max_lr has 2 values, param_groups has 1"
    )

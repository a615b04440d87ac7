"""Stop signals owned by the core, with real processes and real signals: the stop comes at
an iteration boundary of training or validation, one checkpoint is saved there, the process
ends by the signal, and resuming from that checkpoint is exact."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun import Runner, hookimpl
from hookrun.testing import assert_same_checkpoint, run_resume_job, train_reference

TERMINATED = -signal.SIGTERM


def newest_stop_file(work_dir: Path) -> Path:
    files = sorted((work_dir / "checkpoints").glob("*.pt"), key=lambda p: p.stat().st_mtime_ns)
    return files[-1]


def test_sigterm_inside_validation_stops_there_and_resumes_exactly(
    tmp_path: Path, resume_reference: Path
) -> None:
    """Validation draws random numbers (augmentation): the save must resume by validating
    again from the random state validation started with."""
    run = tmp_path / "run"
    proc = run_resume_job(
        run,
        expect=TERMINATED,
        plugins={},
        save_every=0,
        signal_at={"hook": "after_val_iter", "iters": 7},
    )
    saved = run / "checkpoints" / "stop_iter_7.pt"
    assert f"SIGTERM received: saved {saved}; stopping" in proc.stderr
    state = torch.load(saved, weights_only=True)
    assert state["loop"] == {
        "epoch": 0,
        "batch": 7,
        "phase": "trained",
        "iter": 7,
        "optimizer_steps": {"main": 7},
    }
    log = (run / "log.jsonl").read_text()
    assert "val/accuracy" not in log  # the pass was cut short: no metrics from half of it
    run_resume_job(run, resume=True, plugins={}, save_every=0)
    assert_same_checkpoint(resume_reference / "final.pt", run / "final.pt")


def test_ctrl_c_mid_epoch_saves_at_the_boundary_and_resumes_exactly(
    tmp_path: Path, resume_reference: Path
) -> None:
    """Ctrl-C used to leave an emergency file one forward pass ahead (BatchNorm's counters,
    random numbers); now it is a stop signal like SIGTERM: the process ends by SIGINT."""
    run = tmp_path / "run"
    plugins = {"checkpoint": {"by_epoch": False, "interval": 100}}
    run_resume_job(
        run,
        expect=-signal.SIGINT,
        plugins=plugins,
        save_every=0,
        signal_at={"hook": "after_train_iter", "iters": 10, "name": "SIGINT"},
    )
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_10.pt"
    run_resume_job(run, resume=True, plugins=plugins, save_every=0)
    assert_same_checkpoint(resume_reference / "final.pt", run / "final.pt")


def test_a_stop_inside_an_accumulation_group_waits_for_its_end(tmp_path: Path) -> None:
    """Partial gradients are not saved, so the stop comes at the group's last batch (7
    batches per epoch, groups of 3: the signal after iteration 11 stops after iteration 13)."""
    options: dict[str, Any] = {"plugins": {}, "save_every": 0, "grad_accum": 3}
    reference = train_reference(tmp_path / "reference", **options)
    run = tmp_path / "run"
    signal_at = {"hook": "after_train_iter", "iters": 11}
    run_resume_job(run, expect=TERMINATED, signal_at=signal_at, **options)
    assert (run / "checkpoints" / "stop_iter_13.pt").is_file()
    run_resume_job(run, resume=True, **options)
    assert_same_checkpoint(reference, run / "final.pt")


def test_checkpoint_plugin_reuses_the_periodic_file_of_the_same_position(
    tmp_path: Path, resume_reference: Path
) -> None:
    run = tmp_path / "run"
    proc = run_resume_job(
        run,
        expect=TERMINATED,
        plugins={"checkpoint": {}},
        save_every=0,
        signal_at={"hook": "after_val_iter", "iters": 14},
    )
    out = run / "checkpoints"
    assert sorted(p.name for p in out.iterdir()) == ["epoch_1.pt", "epoch_2.pt", "latest"]
    assert f"SIGTERM received: saved {out / 'epoch_2.pt'}; stopping" in proc.stderr
    run_resume_job(run, resume=True, plugins={"checkpoint": {}}, save_every=0)
    assert_same_checkpoint(resume_reference / "final.pt", run / "final.pt")


def test_resume_from_a_best_checkpoint_is_exact(tmp_path: Path, resume_reference: Path) -> None:
    """best_accuracy.pt is saved after validation drew its random numbers; it resumes after
    that validation, not by running it again."""
    best = resume_reference / "checkpoints" / "best_accuracy.pt"
    state = torch.load(best, weights_only=True)
    assert state["loop"]["phase"] == "validated"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(best, run / "checkpoints" / "best_accuracy.pt")
    plugins = {"checkpoint": {"save_best": "accuracy"}}
    run_resume_job(run, resume=True, plugins=plugins, save_every=0)
    assert_same_checkpoint(resume_reference / "final.pt", run / "final.pt")


def test_group_sigterm_with_loader_workers_is_a_preemption(tmp_path: Path) -> None:
    """SLURM and torchrun signal the whole process group: the workers must not die first
    and fail the run; the main process saves and ends by SIGTERM (exit 143)."""
    options: dict[str, Any] = {"plugins": {"checkpoint": {}}, "workers": 2, "save_every": 0}
    reference = train_reference(tmp_path / "reference", **options)
    run = tmp_path / "run"
    proc = run_resume_job(
        run,
        expect=TERMINATED,
        signal_at={"hook": "after_train_iter", "iters": 10, "group": True},
        **options,
    )
    assert "killed by signal" not in proc.stderr
    assert f"SIGTERM received: saved {run / 'checkpoints' / 'iter_10.pt'}" in proc.stderr
    run_resume_job(run, resume=True, **options)
    assert_same_checkpoint(reference, run / "final.pt")


class Interrupt:
    """Presses Ctrl-C ``times`` times at once during iteration ``at``."""

    def __init__(self, at: int, times: int) -> None:
        self.at, self.times = at, times

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            for _ in range(self.times):
                signal.raise_signal(signal.SIGINT)


def test_ctrl_c_stops_at_the_boundary_and_twice_stops_at_once(make_toy_runner: Any) -> None:
    runner: Runner = make_toy_runner(plugins={}, max_epochs=3, hooks=[Interrupt(at=2, times=1)])
    with pytest.raises(KeyboardInterrupt):
        runner.train()  # Python's own SIGINT handler, re-delivered to after the save
    assert runner.position.iter == 3
    assert (runner.checkpoint_dir / "stop_iter_3.pt").is_file()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    second = runner.work_dir.parent / "second"
    runner = make_toy_runner(
        plugins={}, max_epochs=3, hooks=[Interrupt(at=2, times=2)], work_dir=second
    )
    with pytest.raises(KeyboardInterrupt):
        runner.train()
    assert runner.iter == 2  # raised inside the hook of iteration 2: no boundary reached
    assert not runner.checkpoint_dir.exists()


def test_stop_signals_are_validated_and_can_be_switched_off(make_toy_runner: Any) -> None:
    from hookrun import ConfigError

    with pytest.raises(ConfigError, match="runner.stop_signals: 'SIGFOO' is not a signal"):
        make_toy_runner(stop_signals=["SIGFOO"])
    with pytest.raises(ConfigError, match="'KILL' is not a signal this platform can catch"):
        make_toy_runner(stop_signals=["KILL"])
    before = signal.getsignal(signal.SIGTERM)
    runner = make_toy_runner(stop_signals=["term", "usr1"], max_epochs=1)
    assert runner.stop_signals.numbers == [signal.SIGTERM, signal.SIGUSR1]
    runner = make_toy_runner(stop_signals=[], max_epochs=1)
    runner.train()
    assert signal.getsignal(signal.SIGTERM) is before


class FailIn:
    """Raises from hook point ``hook`` at iteration ``at``."""

    def __init__(self, hook: str, at: int) -> None:
        self.hook, self.at = hook, at

    @hookimpl
    def after_optimizer_step(self, runner: Any) -> None:
        if self.hook == "after_optimizer_step" and runner.iter == self.at:
            raise RuntimeError("boom")

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if self.hook == "after_train_iter" and runner.iter == self.at:
            raise RuntimeError("boom")


def test_emergency_checkpoints_hold_a_position_that_matches_their_weights(
    make_toy_runner: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the step changed the weights but before the position counts it, no checkpoint
    can be consistent: none is written. After the position counted it, the file's position
    is the iteration its weights come from."""
    runner: Runner = make_toy_runner(
        plugins={"checkpoint": {}}, hooks=[FailIn("after_optimizer_step", 3)]
    )
    with pytest.raises(RuntimeError, match="boom"):
        runner.train()
    assert not list(runner.checkpoint_dir.glob("emergency_*"))
    assert "no checkpoint taken during iteration 3's optimizer step" in capsys.readouterr().err

    second = runner.work_dir.parent / "second"
    runner = make_toy_runner(
        plugins={"checkpoint": {}}, hooks=[FailIn("after_train_iter", 3)], work_dir=second
    )
    weights_after_step: dict[str, torch.Tensor] = {}
    with pytest.raises(RuntimeError, match="boom"):
        runner.train()
    weights_after_step = {k: v.clone() for k, v in runner.unwrapped_model.state_dict().items()}
    saved = torch.load(runner.checkpoint_dir / "emergency_iter_4.pt", weights_only=True)
    assert saved["loop"]["iter"] == 4
    for key, value in weights_after_step.items():
        assert torch.equal(saved["model"][key], value)

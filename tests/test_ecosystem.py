"""Plugins from outside: a third-party package installed for real, and a scaffolded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import TOY_TASK, clean_env, run, write

ROOT = Path(__file__).resolve().parent.parent
EARLY_STOPPING = ROOT / "examples" / "third_party" / "hookrun-early-stopping"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def early_stopping_installed():
    pip("install", "--no-deps", "--no-build-isolation", str(EARLY_STOPPING))
    yield
    pip("uninstall", "-y", "hookrun-early-stopping")


def val_losses(work_dir: Path) -> list[float]:
    lines = [json.loads(x) for x in (work_dir / "log.jsonl").read_text().splitlines()]
    return [line["val/loss"] for line in lines if "val/loss" in line]


def test_third_party_plugin_and_writer_from_a_config_file(early_stopping_installed, tmp_path):
    listed = json.loads(run("plugins", "list", "--json").stdout)
    rows = {row["name"]: row for row in listed}
    assert rows["early_stopping"]["distribution"] == "hookrun-early-stopping"
    write(tmp_path / "toytask.py", TOY_TASK)
    config = write(
        tmp_path / "es.yaml",
        """
        task: toytask.py:build
        runner: {max_epochs: 2, device: cpu, writers: [jsonl, csv]}
        plugins:
          logger: false
          timer: false
          checkpoint: {max_keep: 2}
          early_stopping: {monitor: loss, patience: 2, min_delta: 100.0}
        """,
    )
    work_dir = tmp_path / "run"
    first = run("train", config, "--work-dir", work_dir)
    assert first.returncode == 0, first.stderr
    assert len(val_losses(work_dir)) == 2  # epoch 1 sets the best, epoch 2 is 1 bad validation
    rows = (work_dir / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,name,value" and any(",val/loss," in r for r in rows[1:])
    # epoch_2.pt is written when epoch 2's training ends, before its validation
    state = torch.load(work_dir / "checkpoints" / "epoch_2.pt", weights_only=True)["plugins"]
    assert state["early_stopping"] == {"best": val_losses(work_dir)[0], "bad_validations": 0}
    # resumed with room for 8 more epochs: validations 2 and 3 count against the restored best
    # (a fresh plugin would need epochs 2, 3 and 4)
    second = run("train", config, "--work-dir", work_dir, "--resume", "auto",
                 "--set", "runner.max_epochs=10")  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "early stopping: loss did not improve for 2 validations" in second.stdout
    assert len(val_losses(work_dir)) == 2 + 2


def test_third_party_settings_are_validated_by_name(early_stopping_installed, tmp_path):
    write(tmp_path / "toytask.py", TOY_TASK)
    config = write(
        tmp_path / "bad.yaml",
        """
        task: toytask.py:build
        plugins: {early_stopping: {patience: 0, rule: sideways}}
        """,
    )
    result = run("config", "validate", config)
    assert result.returncode == 2
    assert "plugins.early_stopping.patience: Input should be greater than or equal to 1" in (
        result.stderr
    )
    assert "plugins.early_stopping.rule:" in result.stderr


def test_scaffolded_plugin_passes_its_own_test_after_install(tmp_path):
    created = run("plugins", "new", "iter_counter", "--dir", tmp_path)
    assert created.returncode == 0, created.stderr
    package = tmp_path / "hookrun-iter-counter"
    pip("install", "--no-deps", "--no-build-isolation", "-e", str(package))
    try:
        listed = json.loads(run("plugins", "list", "--json").stdout)
        assert "iter_counter" in {row["name"] for row in listed}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=package, capture_output=True, text=True, timeout=300,
            env=clean_env(HOOKRUN_PLUGINS_AUTOLOAD="0"),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "2 passed" in proc.stdout  # the conformance checks and its own test
    finally:
        pip("uninstall", "-y", "hookrun-iter-counter")


def test_pytest_plugin_changes_nothing_for_tests_that_do_not_ask(tmp_path):
    """hookrun.testing is loaded into every pytest run (entry point pytest11): a test using
    none of its fixtures sees no environment change, no torch and no runner imported."""
    (tmp_path / "test_plain.py").write_text(
        "import os, sys\n"
        "def test_untouched(request):\n"
        "    assert request.config.pluginmanager.has_plugin('hookrun')\n"
        "    assert not any(k.startswith('HOOKRUN_') for k in os.environ)\n"
        "    assert 'torch' not in sys.modules and 'hookrun.runner' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr

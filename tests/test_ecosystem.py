"""Plugins from outside: a third-party package installed for real, and a scaffolded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import TOY_TASK, clean_env, run, write

ROOT = Path(__file__).resolve().parent.parent
GRAD_NORM = ROOT / "examples" / "third_party" / "hookrun-grad-norm"


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def grad_norm_installed():
    pip("install", "--no-deps", "--no-build-isolation", str(GRAD_NORM))
    yield
    pip("uninstall", "-y", "hookrun-grad-norm")


def test_third_party_plugin_and_writer_from_a_config_file(grad_norm_installed, tmp_path):
    listed = json.loads(run("plugins", "list", "--json").stdout)
    rows = {row["name"]: row for row in listed}
    assert rows["grad_norm"]["distribution"] == "hookrun-grad-norm"
    write(tmp_path / "toytask.py", TOY_TASK)
    config = write(
        tmp_path / "gn.yaml",
        """
        task: toytask.py:build
        runner: {max_epochs: 2, device: cpu, log_interval: 1, writers: [jsonl, csv]}
        plugins:
          logger: false
          timer: false
          checkpoint: false
          grad_norm: {name: gnorm}
        """,
    )
    work_dir = tmp_path / "run"
    result = run("train", config, "--work-dir", work_dir)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in (work_dir / "log.jsonl").read_text().splitlines()]
    norms = [line["train/gnorm"] for line in lines if "train/gnorm" in line]
    iters = [line["train/loss"] for line in lines if "train/loss" in line]
    assert len(norms) == len(iters) > 0 and all(0 < n < float("inf") for n in norms)
    rows = (work_dir / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,name,value"
    assert sum(",train/gnorm," in r for r in rows[1:]) == len(norms)


def test_third_party_grad_norm_equals_torchs_total_norm(grad_norm_installed, tmp_path):
    """The example's value at every optimizer step against ``torch.nn.utils.get_total_norm``
    of the same gradients, taken by a hook that runs after it at the same hook point."""
    import torch

    from hookrun import Runner, hookimpl
    from hookrun.testing import toy_runner_kwargs

    class Reference:
        priority = 90

        def __init__(self):
            self.norms = []

        @hookimpl
        def before_optimizer_step(self, optimizer):
            grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
            self.norms.append(float(torch.nn.utils.get_total_norm(grads, 3.0)))

    reference = Reference()
    kwargs = toy_runner_kwargs(tmp_path, hooks=[reference], plugins={"grad_norm": {"norm_type": 3}})
    runner = Runner(**kwargs)
    runner.train()
    logged = [float(v) for v in runner.scalars.history("train/grad_norm")]
    assert len(logged) == len(reference.norms) == 6
    assert logged == pytest.approx(reference.norms, rel=1e-6)


def test_third_party_settings_are_validated_by_name(grad_norm_installed, tmp_path):
    write(tmp_path / "toytask.py", TOY_TASK)
    config = write(
        tmp_path / "bad.yaml",
        """
        task: toytask.py:build
        plugins: {grad_norm: {norm_type: 0, nmae: x}}
        """,
    )
    result = run("config", "validate", config)
    assert result.returncode == 2
    assert "plugins.grad_norm.norm_type: Input should be greater than 0" in result.stderr
    assert "plugins.grad_norm.nmae: unknown setting" in result.stderr


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

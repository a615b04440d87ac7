"""Plugins from outside: a third-party package installed for real, and a scaffolded one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import clean_env, run, write
from hookrun.testing import TOY_TASK_SOURCE, layered_venv

ROOT = Path(__file__).resolve().parent.parent
GRAD_NORM = ROOT / "examples" / "third_party" / "hookrun-grad-norm"


# Packages are installed into a layered venv (it sees this environment's packages), never
# into the running environment that other tests and xdist workers share.


def install(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "-q", "install", "--no-deps", "--no-build-isolation", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr


def hookrun_in(python: Path, *args: object, cwd: Path | None = None, **env: str):
    """``python -m hookrun ARGS`` in that environment, as a user's shell runs it."""
    command = [str(python), "-m", "hookrun", *map(str, args)]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=clean_env(**env), timeout=600
    )


@pytest.fixture(scope="module")
def grad_norm_venv(tmp_path_factory) -> Path:
    """The python of a layered venv with the third-party example installed (not editable)."""
    python = layered_venv(tmp_path_factory.mktemp("grad-norm-venv"))
    install(python, str(GRAD_NORM))
    return python


@pytest.fixture
def grad_norm_here(grad_norm_venv, monkeypatch) -> None:
    """The example importable and discoverable in this process, for this test only."""
    (site_packages,) = grad_norm_venv.parent.parent.glob("lib/python*/site-packages")
    monkeypatch.syspath_prepend(str(site_packages))


def test_third_party_plugin_and_writer_from_a_config_file(grad_norm_venv, tmp_path):
    listed = json.loads(hookrun_in(grad_norm_venv, "plugins", "list", "--json").stdout)
    rows = {row["name"]: row for row in listed}
    assert rows["grad_norm"]["distribution"] == "hookrun-grad-norm"
    write(tmp_path / "toytask.py", TOY_TASK_SOURCE)
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
    result = hookrun_in(grad_norm_venv, "train", config, "--work-dir", work_dir)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(x) for x in (work_dir / "log.jsonl").read_text().splitlines()]
    norms = [line["train/gnorm"] for line in lines if "train/gnorm" in line]
    iters = [line["train/loss"] for line in lines if "train/loss" in line]
    assert len(norms) == len(iters) > 0 and all(0 < n < float("inf") for n in norms)
    rows = (work_dir / "scalars.csv").read_text().splitlines()
    assert rows[0] == "step,name,value"
    assert sum(",train/gnorm," in r for r in rows[1:]) == len(norms)


def test_third_party_grad_norm_equals_torchs_total_norm(grad_norm_here, tmp_path):
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


def test_third_party_settings_are_validated_by_name(grad_norm_venv, tmp_path):
    write(tmp_path / "toytask.py", TOY_TASK_SOURCE)
    config = write(
        tmp_path / "bad.yaml",
        """
        task: toytask.py:build
        plugins: {grad_norm: {norm_type: 0, nmae: x}}
        """,
    )
    result = hookrun_in(grad_norm_venv, "config", "validate", config)
    assert result.returncode == 2
    assert "plugins.grad_norm.norm_type: Input should be greater than 0" in result.stderr
    assert "plugins.grad_norm.nmae: unknown setting" in result.stderr


def test_scaffolded_plugin_passes_its_own_test_after_install(tmp_path):
    created = run("plugins", "new", "iter_counter", "--dir", tmp_path)
    assert created.returncode == 0, created.stderr
    package = tmp_path / "hookrun-iter-counter"
    python = layered_venv(tmp_path / "venv")
    install(python, "-e", str(package))
    listed = json.loads(hookrun_in(python, "plugins", "list", "--json").stdout)
    assert "iter_counter" in {row["name"] for row in listed}
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=package, capture_output=True, text=True, timeout=300,
        env=clean_env(HOOKRUN_PLUGINS_AUTOLOAD="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout  # the conformance checks and its own test


def test_pytest_plugin_changes_nothing_for_tests_that_do_not_ask(tmp_path):
    """hookrun.testing is loaded into every pytest run (entry point pytest11): a test using
    none of its fixtures sees no environment change, no torch and no runner imported."""
    (tmp_path / "test_plain.py").write_text(
        "import os, sys\n"
        "def test_untouched(request):\n"
        "    assert request.config.pluginmanager.has_plugin('hookrun')\n"
        "    assert not any(k.startswith('HOOKRUN_') for k in os.environ)\n"
        "    assert 'torch' not in sys.modules and 'hookrun.engine.runner' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr

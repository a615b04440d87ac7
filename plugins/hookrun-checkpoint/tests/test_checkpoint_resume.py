"""Real processes: SIGKILL at arbitrary points and SIGTERM, then resume="auto", end with the
same state, bit for bit, as a run never interrupted."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun.testing import forked

JOB = Path(__file__).parent / "jobs" / "checkpoint_job.py"
ENV = {**os.environ, "HOOKRUN_PLUGINS_AUTOLOAD": "0"}


def start(work_dir: Path, **options: Any) -> subprocess.Popen:
    return forked.spawn(
        [sys.executable, str(JOB), str(work_dir), json.dumps(options)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(work_dir: Path, expect: int = 0, **options: Any) -> str:
    proc = start(work_dir, **options)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == expect, err
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, in this process (the same code; saves a torch start-up)."""
    work_dir = tmp_path_factory.mktemp("reference")
    spec = importlib.util.spec_from_file_location("checkpoint_job", JOB)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
        job.main(str(work_dir), {})
    torch.set_num_threads(threads)
    return work_dir / "final.pt"


def iterations(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("iter ")]


def newest(work_dir: Path) -> str:
    return (work_dir / "checkpoints" / "latest").read_text().strip()


def test_sigkill_anywhere_then_resume_auto_is_bit_identical(
    tmp_path: Path, reference: Path, assert_same_state: Callable
) -> None:
    # 7 batches per epoch, a checkpoint every 3 iterations, best_accuracy.pt after validations
    run(tmp_path, -signal.SIGKILL, kill_at=5)  # mid-epoch 0, two iterations after iter_3
    assert newest(tmp_path) == "iter_3.pt"
    out = run(tmp_path, -signal.SIGKILL, resume=True, kill_in_save_at=12)  # while saving
    assert iterations(out)[0] == "iter 4"
    assert newest(tmp_path) == "iter_9.pt"
    assert not (tmp_path / "checkpoints" / "iter_12.pt").exists()
    out = run(tmp_path, resume=True)
    assert iterations(out)[0] == "iter 10"
    assert_same_state(reference, tmp_path / "final.pt")
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["plugins"]["counter"]["iters"] == 21  # no iteration counted twice


def test_sigterm_saves_exits_terminated_and_resumes_exactly(
    tmp_path: Path, reference: Path, assert_same_state: Callable
) -> None:
    proc = start(tmp_path, sleep=0.05, checkpoint={"async_save": True})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "iter 8":
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err
    assert "SIGTERM received" in err  # stop lines go to stderr
    saved = newest(tmp_path)
    stopped_at = int(saved.removeprefix("iter_").removesuffix(".pt"))
    assert 8 <= stopped_at < 21
    assert err.splitlines()[-1].endswith(f"/{saved}; stopping")
    assert not (tmp_path / "final.pt").exists()
    out = run(tmp_path, resume=True)
    assert iterations(out)[0] == f"iter {stopped_at + 1}"
    assert_same_state(reference, tmp_path / "final.pt")

"""A disk that fills up in the middle of training, for real: a 3 MB tmpfs as the work dir.

Mounting needs root (and a kernel that lets the container mount); elsewhere the test is
skipped and ``test_checkpoint_errors`` covers the same write path with ``RLIMIT_FSIZE``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hookrun.testing import forked, isolated_env, write_toy_task

CONFIG = """
task: toytask.py:build
task_args: {width: 40000}  # a Linear(4, 40000): 0.8 MB a checkpoint, so the 4th does not fit
runner: {max_epochs: 6, device: cpu, writers: [jsonl]}
plugins: {checkpoint: {max_keep: null}, logger: false, timer: false}
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)]
    try:
        mounted = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)


def test_a_disk_filling_mid_run_exits_1_naming_the_file_and_every_older_file_loads(
    small_disk, tmp_path
):
    config = write_toy_task(tmp_path, CONFIG)
    work_dir = small_disk / "run"
    proc = forked.run(
        [sys.executable, "-m", "hookrun", "train", str(config), "--work-dir", str(work_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=isolated_env(),
    )
    checkpoints = work_dir / "checkpoints"
    assert proc.returncode == 1, proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line == (
        f"error: cannot write checkpoint {checkpoints / 'epoch_4.pt'}: No space left on device"
    )
    assert "Traceback" not in proc.stderr
    # nothing half-written, nothing lost: the three saved files, latest still naming the 3rd
    names = sorted(path.name for path in checkpoints.iterdir())
    assert names == ["epoch_1.pt", "epoch_2.pt", "epoch_3.pt", "latest"]
    assert (checkpoints / "latest").read_text().strip() == "epoch_3.pt"
    for epoch in (1, 2, 3):
        state = torch.load(checkpoints / f"epoch_{epoch}.pt", weights_only=True)
        assert state["model"]["weight"].shape == (40000, 4)
        assert state["loop"]["iter"] == 4 * epoch  # 32 samples in batches of 8 an epoch

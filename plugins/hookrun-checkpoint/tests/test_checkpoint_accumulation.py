"""Gradient accumulation: an iteration save waits for the end of its accumulation group, so
every file resumes exactly, also when an epoch's length is not a multiple of ``grad_accum``.

The resume task has 7 batches per epoch; with ``grad_accum=3`` each epoch's groups are its
batches 1-3, 4-6 and 7 (the epoch's last batch closes a group), so groups end at global
iterations 3, 6, 7 | 10, 13, 14 | 17, 20, 21."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun.testing import check_kill_and_resume, resume_job

OPTIONS: dict[str, Any] = {"grad_accum": 3, "save_every": 0}  # only the plugin saves iterations


def in_process(work_dir: Path, interval: int) -> Path:
    """The resume task run to the end in this process; its checkpoint folder."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
        plugins = {"checkpoint": {"by_epoch": False, "interval": interval}}
        resume_job(work_dir, plugins=plugins, **OPTIONS)
    torch.set_num_threads(threads)
    return work_dir / "checkpoints"


@pytest.mark.parametrize(
    ("interval", "saved"),
    [
        # due at 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, then the last iteration
        (2, [3, 6, 10, 13, 14, 17, 20, 21]),
        # a multiple of grad_accum (the old recipe) is due inside groups from epoch 2 on: 9, 12
        (3, [3, 6, 10, 13, 17, 20, 21]),
    ],
)
def test_iteration_saves_land_at_the_end_of_accumulation_groups(
    tmp_path: Path, interval: int, saved: list[int]
) -> None:
    out = in_process(tmp_path, interval)
    assert sorted(int(p.name[5:-3]) for p in out.glob("iter_*.pt")) == saved


def test_kill_inside_a_group_resumes_exactly_from_the_group_end_before(tmp_path: Path) -> None:
    """Killed after iteration 13; the save due at 12 (inside 11-13) waited for 13."""
    reference = in_process(tmp_path / "reference", 2).parent / "final.pt"
    crashed = check_kill_and_resume(
        tmp_path,
        kill_at=13,
        reference=reference,
        plugins={"checkpoint": {"by_epoch": False, "interval": 2}},
        **OPTIONS,
    )
    assert not (crashed / "checkpoints" / "iter_12.pt").exists()
    resumed = torch.load(crashed / "checkpoints" / "iter_13.pt", weights_only=True)
    assert resumed["loop"]["batch"] == 6  # epoch 2's second group complete

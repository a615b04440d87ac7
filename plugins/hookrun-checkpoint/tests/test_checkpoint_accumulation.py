"""Gradient accumulation: an iteration save waits for the end of its accumulation group, so
every file resumes exactly, also when an epoch's length is not a multiple of ``grad_accum``.

The resume task has 7 batches per epoch; with ``grad_accum=3`` each epoch's groups are its
batches 1-3, 4-6 and 7 (the epoch's last batch closes a group), so groups end at global
iterations 3, 6, 7 | 10, 13, 14 | 17, 20, 21."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun import hookimpl
from hookrun.testing import assert_same_checkpoint, check_kill_and_resume, resume_job

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


class SaveAfterValidation:
    """Ad-hoc hook: ``val_<iter>.pt`` after every validation, as a best file is saved."""

    @hookimpl
    def after_val_epoch(self, runner: Any) -> None:
        runner.save_checkpoint(runner.checkpoint_dir / f"val_{runner.iter}.pt")


def test_validation_waits_for_the_group_end_so_its_checkpoints_resume_exactly(
    tmp_path: Path,
) -> None:
    """Iteration-based, validation every 5 iterations: due at 5, 10, 15 and 17 (the last);
    groups end at 3, 6, 7, 10, 13, 14, 17. Validation runs at 6, 10 and 17 (15 waits for 17,
    which validates once), so a checkpoint taken with it holds no partial gradients."""
    options: dict[str, Any] = {**OPTIONS, "max_epochs": None, "max_iters": 17, "val_interval": 5}
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")
        resume_job(tmp_path / "reference", hooks=[SaveAfterValidation()], **options)
        saved = tmp_path / "reference" / "checkpoints"
        assert sorted(p.name for p in saved.glob("val_*.pt")) == [
            "val_10.pt",
            "val_17.pt",
            "val_6.pt",
        ]
        log = (tmp_path / "reference" / "log.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in log if '"val/loss"' in x] == [6, 10, 17]
        for name in ("val_6.pt", "val_10.pt"):
            run = tmp_path / name
            (run / "checkpoints").mkdir(parents=True)
            shutil.copy(saved / name, run / "checkpoints" / name)
            resume_job(run, resume=True, **options)
            assert_same_checkpoint(tmp_path / "reference" / "final.pt", run / "final.pt")
            log = (run / "log.jsonl").read_text().splitlines()
            # the resumed run does not validate again where its file was taken
            assert [json.loads(x)["step"] for x in log if '"val/loss"' in x] == [10, 17][
                name == "val_10.pt" :
            ]
    torch.set_num_threads(threads)

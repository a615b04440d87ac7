"""SIGKILL chains: a run killed at several random iterations, resumed with ``--resume auto``
after each kill, ends bit for bit where a run never interrupted ends, with every state a
resume must restore at once: random augmentation in the main process and in loader workers,
dropout, AdamW, a schedule, EMA (its average compared whole), precise-BN, accumulation
groups that do not divide the epoch, epoch- and iteration-based runs.

The kill points are drawn from a seeded generator (so a failure names its chain and
reproduces); each kill lands where iterations run, between or just after saves."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from hookrun.testing import check_kill_and_resume

PLUGINS = {
    "ema": {"decay": 0.9},
    "precise_bn": {"num_batches": 2},
    # iteration saves every 2 (each waits for its accumulation group's end)
    "checkpoint": {"by_epoch": False, "interval": 2, "max_keep": 2},
}


def chain(seed: int, last: int, kills: int = 3) -> list[int]:
    """``kills`` distinct iteration counts in 1..last-1, ascending."""
    return sorted(random.Random(seed).sample(range(1, last), kills))


CASES: dict[str, dict[str, Any]] = {
    # 3 epochs of 7 batches: 21 iterations, validation (precise-BN first) after each epoch
    "epochs, workers 0": {"workers": 0, "kill_at": chain(1, 21)},
    # 17 iterations, validation every 5; groups of 3 close early at each epoch's 7th batch
    "iterations, workers 2, grad_accum 3": {
        "workers": 2,
        "grad_accum": 3,
        "max_epochs": None,
        "max_iters": 17,
        "val_interval": 5,
        "kill_at": chain(2, 17),
    },
}


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case}, kills {CASES[case]['kill_at']}")
def test_sigkill_chain_resumes_bit_for_bit(tmp_path: Path, case: str) -> None:
    options = dict(CASES[case])
    check_kill_and_resume(
        tmp_path,
        plugins=PLUGINS,
        batch_norm=True,
        save_every=0,
        exact_plugins=("ema",),
        **options,
    )

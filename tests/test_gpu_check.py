"""``benchmarks/gpu.py``, the GPU check: without a CUDA device it says so and exits 0, and
``--cpu-check`` runs every part of it (on tiny sizes) so an API change cannot break it unseen
before a GPU machine is lent."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from hookrun.testing import forked, isolated_env

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu.py measures")
def test_without_cuda_it_says_so_and_every_part_runs_on_the_cpu() -> None:
    bare = forked.run(
        [sys.executable, SCRIPT], env=isolated_env(), capture_output=True, text=True, timeout=120
    )
    assert (bare.returncode, bare.stderr) == (0, ""), bare.stderr
    assert bare.stdout.splitlines() == [
        "benchmarks/gpu.py: no CUDA device on this machine; nothing measured"
    ]

    check = [sys.executable, SCRIPT, "--cpu-check", "--iters", "12", "--repeats", "1"]
    defaults = {**isolated_env(), "HOOKRUN_PLUGINS_AUTOLOAD": "1"}  # as a user runs it
    ran = forked.run(check, env=defaults, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in ran.stdout.splitlines()[1:-1])
    assert list(rows) == [
        "ResNet-18 fp32: hand / hookrun ms per iteration, ratio",
        "ResNet-18 bf16: hand / hookrun ms per iteration, ratio",
        "nan-guard: ms per iteration added (fp32)",
        "timer train/time / synchronised host clock, ms",
        "compiled ResNet-18 fp32: hand / hookrun ms per iteration, ratio",
        "compiled part, wall seconds (compilation included)",
    ]
    assert not [value for value in rows.values() if "nan" in value]  # every figure measured

"""Memory scalars in the JSONL log at every report, what they measure, the cache flags."""

from __future__ import annotations

import json
import resource
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from hookrun import PluginError, Runner, hookimpl
from hookrun.testing import toy_runner_kwargs

MIB = 2**20


class Hold:
    """Allocates and touches ``mib`` MiB during iteration ``at`` and keeps it alive."""

    def __init__(self, at: int, mib: int) -> None:
        self.at, self.mib = at, mib
        self.kept: list[torch.Tensor] = []

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            self.kept.append(torch.ones(self.mib * MIB, dtype=torch.uint8))


def run(tmp_path: Path, memory: dict[str, Any], **overrides: Any) -> Runner:
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path,
            log_interval=2,
            plugins={"memory": memory},
            writers=("jsonl",),
            **overrides,
        )
    )
    runner.console = Console(file=StringIO(), width=200)
    runner.train()
    return runner


def reports(runner: Runner) -> list[dict[str, Any]]:
    lines = (runner.work_dir / "log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/loss" in r]


def test_memory_scalars_at_every_report_on_cpu(tmp_path: Path) -> None:
    hold = Hold(at=2, mib=96)
    runner = run(tmp_path, {}, hooks=[hold])
    rows = reports(runner)
    # every report: each log_interval (2, 4, 6) and each epoch's end (3, 6)
    assert [r["step"] for r in rows] == [2, 3, 4, 6]
    for row in rows:
        assert 0 < row["train/memory/rss"] <= row["train/memory/max_rss"]
    # the 96 MiB touched during iteration 2 show from the report after it
    grown = rows[1]["train/memory/rss"] - rows[0]["train/memory/rss"]
    assert 90 < grown < 200, grown
    # the peak agrees with the kernel's own count read another way (getrusage)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert rows[-1]["train/memory/max_rss"] <= peak + 1


def test_no_hook_runs_between_reports(tmp_path: Path) -> None:
    """Everything happens when the core reads its report: no per-iteration hook at all."""
    runner = run(tmp_path, {})
    listed = dict(runner.plugin_order)
    assert set(listed) == {"memory"}
    plugin = runner.plugins["memory"]
    assert set(plugin.unused_hooks(runner)) == {
        "before_train_epoch",
        "after_train_epoch",
        "after_train_iter",
    }


def test_empty_cache_on_cpu_is_a_one_time_notice(tmp_path: Path) -> None:
    flags = ["before_epoch", "after_epoch", "after_iter"]
    runner = run(tmp_path, {"empty_cache": flags, "scalars": False})
    out = runner.console.file.getvalue()  # type: ignore[attr-defined]
    assert out.count("memory: empty_cache does nothing on the CPU") == 1
    assert not any(k.startswith("train/memory") for r in reports(runner) for k in r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_scalars_without_syncs_between_reports(tmp_path: Path) -> None:
    runner = run(tmp_path, {}, device="cuda")
    for row in reports(runner):
        assert 0 < row["train/memory/allocated"] <= row["train/memory/max_allocated"]
        assert row["train/memory/allocated"] <= row["train/memory/reserved"]


def test_bad_setting_is_one_line_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, plugins={"memory": {"empty_cache": ["after_epochs"]}}))
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(
        "plugins.memory.empty_cache.0: Input should be 'before_epoch', 'after_epoch' or "
        "'after_iter' (got 'after_epochs')"
    )

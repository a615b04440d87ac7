"""Traces on disk, the iterations profiled and nothing alive outside them, the summary."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from hookrun import ConfigError, PluginError, Priority, Runner, hookimpl
from hookrun.testing import toy_runner_kwargs


class WhoIsProfiled:
    """Records, at the start of every iteration, whether the plugin holds a profiler
    (warm-up or recording); the traces' ``ProfilerStep#N`` show what was recorded."""

    priority = Priority.HIGHEST

    def __init__(self) -> None:
        self.alive: list[bool] = []

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        self.alive.append(runner.plugins["profiler"].profile is not None)


def profiled_run(tmp_path: Path, **settings: Any) -> tuple[Runner, WhoIsProfiled]:
    """6 iterations (2 epochs of 3) of the toy task, no validation, JSONL log."""
    probe = WhoIsProfiled()
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path,
            val_dataloader=None,
            plugins={"profiler": settings},
            hooks=[probe],
            writers=("jsonl",),
        )
    )
    runner.console = Console(file=StringIO(), width=200)
    runner.train()
    return runner, probe


def recorded_steps(trace: Path) -> list[int]:
    """The iterations a Chrome trace recorded, from its ``ProfilerStep#N`` spans."""
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name", "") for e in events}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def console(runner: Runner) -> str:
    file = runner.console.file
    assert isinstance(file, StringIO)
    return file.getvalue()


def test_a_window_leaves_chrome_and_tensorboard_traces_and_a_summary(tmp_path: Path) -> None:
    runner, probe = profiled_run(tmp_path, wait=1, warmup=1, active=2)
    # iteration 0 waits, 1 warms up, 2 and 3 are recorded; no profiler before or after
    assert probe.alive == [False, True, True, True, False, False]
    out = tmp_path / "run" / "profiler"
    chrome = json.loads((out / "rank0.iter_2-3.trace.json").read_text())
    names = [e.get("name", "") for e in chrome["traceEvents"]]
    assert any(n.startswith("aten::addmm") for n in names)
    assert recorded_steps(out / "rank0.iter_2-3.trace.json") == [2, 3]  # the active ones
    (board_file,) = (out / "tensorboard").glob("rank0.iter_2-3.*.pt.trace.json")
    board = json.loads(board_file.read_text())
    assert board["traceEvents"] == chrome["traceEvents"]
    assert len(list(out.rglob("*.json"))) == 2
    # the summary: the op with most self time, per the trace's own durations, is named first
    records = [
        json.loads(line) for line in (runner.work_dir / "log.jsonl").read_text().splitlines()
    ]
    (summary,) = [r["profiler_summary"] for r in records if "profiler_summary" in r]
    assert [row["self_ms"] for row in summary] == sorted(
        (r["self_ms"] for r in summary), reverse=True
    )
    top = summary[0]["op"]
    assert top in names
    assert f"top op {top}" in console(runner)
    assert len(summary) == 10


def test_repeated_windows_and_nothing_alive_in_between(tmp_path: Path) -> None:
    runner, probe = profiled_run(tmp_path, wait=1, warmup=0, active=1, repeat=0)
    assert probe.alive == [False, True, False, True, False, True]
    files = sorted(p.name for p in (tmp_path / "run" / "profiler").glob("*.trace.json"))
    assert files == [
        "rank0.iter_1-1.trace.json",
        "rank0.iter_3-3.trace.json",
        "rank0.iter_5-5.trace.json",
    ]
    for i in (1, 3, 5):
        assert recorded_steps(tmp_path / f"run/profiler/rank0.iter_{i}-{i}.trace.json") == [i]
    assert runner.plugins["profiler"].profile is None


def test_a_window_beyond_the_end_is_a_notice_and_cut_short(tmp_path: Path) -> None:
    runner, probe = profiled_run(tmp_path, wait=4, warmup=1, active=3, tensorboard=False)
    assert probe.alive == [False, False, False, False, True, True]
    assert (
        "profiler: the window of iterations 4-7 reaches beyond the run's end (6 iterations); "
        "it is cut short there"
    ) in console(runner)
    files = [p.name for p in (tmp_path / "run" / "profiler").rglob("*.json")]
    assert files == ["rank0.iter_5-5.trace.json"]
    assert recorded_steps(tmp_path / "run/profiler/rank0.iter_5-5.trace.json") == [5]


def test_no_window_within_the_run(tmp_path: Path) -> None:
    runner, probe = profiled_run(tmp_path, skip_first=10)
    assert not any(probe.alive)
    assert "profiler: no window falls within iterations 0-5" in console(runner)
    assert not (tmp_path / "run" / "profiler").exists()


def test_bad_setting_is_one_line_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as info:
        Runner(**toy_runner_kwargs(tmp_path, plugins={"profiler": {"active": 0}}))
    assert info.value.lines == [
        "plugins.profiler.active: Input should be greater than or equal to 1 (got 0)"
    ]


def test_cuda_activities_need_a_cuda_device(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    runner = Runner(**toy_runner_kwargs(tmp_path, plugins={"profiler": {"activities": "cuda"}}))
    with pytest.raises(ConfigError) as info:
        runner.train()
    assert info.value.lines == [
        "plugins.profiler.activities: 'cuda' needs a CUDA device (runner.device is cpu)"
    ]


@pytest.mark.filterwarnings("ignore:`export_memory_timeline` is deprecated:FutureWarning")
def test_memory_timeline_is_written_beside_the_trace(tmp_path: Path) -> None:
    profiled_run(tmp_path, wait=1, warmup=1, active=2, memory_timeline=True, tensorboard=False)
    out = tmp_path / "run" / "profiler"
    times, sizes = json.loads((out / "rank0.iter_2-3.memory.json").read_text())[:2]
    assert len(times) == len(sizes) > 0
    assert any(sum(row) > 0 for row in sizes)  # bytes per category at each moment

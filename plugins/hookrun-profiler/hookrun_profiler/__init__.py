"""hookrun-profiler: ``torch.profiler`` over a schedule of training iterations.

``torch.profiler.schedule(wait, warmup, active, repeat, skip_first)`` decides, for each
global iteration, whether it is profiled; the windows (warm-up then active iterations) are
computed once before training, and a ``torch.profiler.profile`` object exists only from the
start of a window's warm-up to the end of its last active iteration: outside the windows
the plugin costs one integer comparison per iteration and no profiler is alive. At a
window's end (after ``stop()``) the trace is written per rank under ``<work_dir>/profiler/``
(TensorBoard's profiler plugin format and/or a Chrome trace) and its ops are added to a
summary printed on rank 0 and written to the JSONL log at the end of training.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from rich.table import Table
from torch.profiler import ProfilerAction, ProfilerActivity

from hookrun import ConfigError, Plugin, PluginSettings, Priority, RunnerProtocol, hookimpl

__all__ = ["Profiler", "ProfilerSettings"]


class ProfilerSettings(PluginSettings):
    """Settings of the ``profiler`` plugin."""

    wait: int = Field(1, ge=0, description="Iterations left alone at the start of each cycle.")
    warmup: int = Field(
        1,
        ge=0,
        description="Iterations traced but thrown away before the active ones (the "
        "profiler's own start-up would skew the first).",
    )
    active: int = Field(3, ge=1, description="Iterations recorded in each cycle.")
    repeat: int = Field(
        1, ge=0, description="Cycles of wait, warmup, active; 0 repeats until training ends."
    )
    skip_first: int = Field(
        0, ge=0, description="Iterations of the run skipped before the first cycle."
    )
    activities: Literal["auto", "cpu", "cuda"] | list[Literal["cpu", "cuda"]] = Field(
        "auto",
        description="What is traced: `auto` is the CPU, plus CUDA kernels when the run is "
        "on a CUDA device; or `cpu`, `cuda`, or a list of them.",
    )
    record_shapes: bool = Field(False, description="Record the input shapes of each op.")
    profile_memory: bool = Field(False, description="Record tensor allocations and frees.")
    with_stack: bool = Field(
        False, description="Record the Python and C++ stack of each op (large traces)."
    )
    with_flops: bool = Field(
        False, description="Estimate the FLOPs of matrix multiplications and convolutions."
    )
    tensorboard: bool = Field(
        True,
        description="Write each window with `torch.profiler.tensorboard_trace_handler` to "
        "`<work_dir>/profiler/tensorboard/` (open it with TensorBoard's profiler plugin).",
    )
    chrome: bool = Field(
        True,
        description="Write each window as a Chrome trace, "
        "`<work_dir>/profiler/rank<R>.iter_<first>-<last>.trace.json` (chrome://tracing, "
        "Perfetto).",
    )
    memory_timeline: bool = Field(
        False,
        description="Also export each window's memory timeline "
        "(`rank<R>.iter_<first>-<last>.memory.json`); turns on `profile_memory`, "
        "`record_shapes` and `with_stack`, which it needs.",
    )
    top: int = Field(
        10, ge=1, description="Rows of the summary table: the ops with most self time."
    )


class Profiler(Plugin[ProfilerSettings]):
    """Profiles the scheduled windows of training iterations; summarises them at the end."""

    name = "profiler"
    Settings = ProfilerSettings
    priority = Priority.LOWEST  # steps the profiler after every other plugin's iteration work
    enabled_by_default = False

    def __init__(self, settings: ProfilerSettings | None = None) -> None:
        super().__init__(settings)
        self.schedule: Callable[[int], ProfilerAction] = schedule(self.settings)
        self.windows: list[tuple[int, int, int]] = []  # (warm-up start, active start, end)
        self.profile: torch.profiler.profile | None = None
        self.window: tuple[int, int, int] | None = None
        self.next_start = -1  # the iteration whose end starts the next window's profiler
        self.ops: dict[str, list[float]] = {}  # name -> [calls, self µs, total µs]
        self.device_time = False
        self.out_dir = Path()
        self.rank = 0
        self.info: Callable[[str], None] = print

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        """Plan the windows of this run; open the first when it starts right away."""
        s = self.settings
        self.out_dir, self.rank, self.info = runner.work_dir / "profiler", runner.rank, runner.info
        self.device_time = "cuda" in activity_names(s.activities, runner.device)
        if self.device_time and runner.device.type != "cuda":
            raise ConfigError(
                f"plugins.profiler.activities: 'cuda' needs a CUDA device (runner.device is "
                f"{runner.device})"
            )
        self.schedule = schedule(s)
        start, known = runner.iter, runner.max_iters
        # an epoch run over a stream has no known length: the schedule's cycles (its first,
        # when it repeats forever) from here
        cycle = s.wait + s.warmup + s.active
        last = known if known is not None else start + s.skip_first + cycle * max(s.repeat, 1)
        self.windows = windows(self.schedule, last + s.warmup + s.active)
        self.windows = [w for w in self.windows if w[2] > start and w[0] < last]
        beyond = [w for w in self.windows if w[2] > last]
        if beyond and known is not None:
            first, _, end = beyond[0]
            runner.info(
                f"profiler: the window of iterations {first}-{end - 1} reaches beyond the "
                f"run's end ({runner.max_iters} iterations); it is cut short there"
            )
        if not self.windows:
            runner.info(f"profiler: no window falls within iterations {start}-{last - 1}")
        self.plan_next(start)
        if self.next_start == start:
            self.open(runner, start)

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        done = runner.iter + 1
        if self.profile is not None:
            assert self.window is not None
            if done >= self.window[2] or runner.is_last_iter() or runner.stop_training:
                self.close(done)
            else:
                self.profile.step()
        if self.profile is None and done == self.next_start:
            self.open(runner, done)

    @hookimpl
    def after_train(self, runner: RunnerProtocol) -> None:
        """A window cut short by the end of training (or a stop) is still written."""
        if self.profile is not None:
            self.close(runner.iter)
        if self.ops and runner.is_main:
            self.report(runner)

    @hookimpl
    def on_exception(self) -> None:
        """Leave no profiler running behind a failed run."""
        if self.profile is not None:
            self.profile.stop()
            self.profile = None

    # -- windows -------------------------------------------------------------------------

    def plan_next(self, done: int) -> None:
        upcoming = [w for w in self.windows if w[2] > done]
        self.next_start = max(upcoming[0][0], done) if upcoming else -1

    def open(self, runner: RunnerProtocol, first: int) -> None:
        """Start a profiler for the window whose iteration ``first`` comes next."""
        s = self.settings
        self.window = next(w for w in self.windows if w[2] > first)
        memory = s.profile_memory or s.memory_timeline
        self.profile = torch.profiler.profile(
            activities=activities(s.activities, runner.device),
            schedule=self.schedule,
            record_shapes=s.record_shapes or s.memory_timeline,
            profile_memory=memory,
            with_stack=s.with_stack or s.memory_timeline,
            with_flops=s.with_flops,
        )
        # the profiler counts the run's iterations: its schedule and its ProfilerStep#<N>
        # spans (in the traces) then follow the global iteration, not the window's
        self.profile.step_num = first
        self.profile.current_action = self.schedule(first)  # type: ignore[assignment]
        self.profile.start()

    def close(self, done: int) -> None:
        """Stop the window's profiler after ``done`` iterations of the run, save what it
        recorded and forget it."""
        profile, window = self.profile, self.window
        assert profile is not None and window is not None
        self.profile = self.window = None
        profile.stop()
        if done > window[1]:  # not cut short during its warm-up: something was recorded
            self.save(profile, window[1], min(done, window[2]) - 1)
        self.windows = [w for w in self.windows if w[0] >= done]  # a window is profiled once
        self.plan_next(done)

    def save(self, profile: torch.profiler.profile, first: int, last: int) -> None:
        """Write the window's traces and add its ops to the summary. torch exports a trace
        once: with both kinds on, the Chrome file is a copy of TensorBoard's."""
        tag = f"rank{self.rank}.iter_{first}-{last}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        chrome = self.out_dir / f"{tag}.trace.json"
        if self.settings.tensorboard:
            board = self.out_dir / "tensorboard"
            torch.profiler.tensorboard_trace_handler(str(board), worker_name=tag)(profile)
            if self.settings.chrome:
                shutil.copyfile(max(board.glob(f"{tag}.*.pt.trace.json")), chrome)
        elif self.settings.chrome:
            profile.export_chrome_trace(str(chrome))
        if self.settings.memory_timeline:
            try:
                profile.export_memory_timeline(str(self.out_dir / f"{tag}.memory.json"))
            except Exception as exc:  # torch's exporter is best effort: a notice, not a failure
                self.info(f"profiler: no memory timeline for {tag} ({exc})")
        for event in profile.key_averages():
            if event.key.startswith("ProfilerStep"):  # the step marker: time between ops
                continue
            row = self.ops.setdefault(event.key, [0, 0.0, 0.0])
            row[0] += event.count
            self_time = event.self_device_time_total if self.device_time else 0.0
            row[1] += event.self_cpu_time_total + self_time
            row[2] += event.cpu_time_total

    def report(self, runner: RunnerProtocol) -> None:
        """The top ops by self time: a table on rank 0's console and a JSONL record."""
        rows = summary_rows(self.ops, self.settings.top)
        table = Table(title="Profiler: top ops by self time (all windows)")
        for column in ("op", "calls", "self", "self %", "total"):
            table.add_column(column, justify="left" if column == "op" else "right")
        for row in rows:
            table.add_row(
                row["op"],
                str(row["calls"]),
                f"{row['self_ms']:.3f} ms",
                f"{row['self_percent']:.1f}",
                f"{row['total_ms']:.3f} ms",
            )
        runner.console.print(table)
        runner.info(f"profiler: traces in {self.out_dir}; top op {rows[0]['op']}")
        for writer in runner.writers:
            writer.write_record({"profiler_summary": rows, "step": runner.iter})

    def state_dict(self) -> dict[str, Any]:
        """The summary so far, so that a resumed run's table covers every window."""
        return {"ops": {name: list(row) for name, row in self.ops.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ops = {name: [int(r[0]), float(r[1]), float(r[2])] for name, r in state["ops"].items()}


def schedule(s: ProfilerSettings) -> Callable[[int], ProfilerAction]:
    """``torch.profiler.schedule`` of the settings: what each iteration of the run does."""
    with warnings.catch_warnings():  # "won't be using warmup": the docs page says it
        warnings.simplefilter("ignore", UserWarning)
        return torch.profiler.schedule(
            wait=s.wait, warmup=s.warmup, active=s.active, repeat=s.repeat, skip_first=s.skip_first
        )


def windows(plan: Callable[[int], ProfilerAction], steps: int) -> list[tuple[int, int, int]]:
    """(warm-up start, active start, end) of each whole window ``plan`` gives within the
    first ``steps`` iterations."""
    out: list[tuple[int, int, int]] = []
    start = active = None
    for step in range(steps):
        action = plan(step)
        if action is ProfilerAction.NONE:
            continue
        if start is None:
            start = step
        if active is None and action is not ProfilerAction.WARMUP:
            active = step
        if action is ProfilerAction.RECORD_AND_SAVE:
            assert active is not None
            out.append((start, active, step + 1))
            start = active = None
    return out


def activity_names(setting: str | list[Literal["cpu", "cuda"]], device: torch.device) -> set[str]:
    """What the ``activities`` setting traces on ``device``."""
    if setting == "auto":
        return {"cpu", "cuda"} if device.type == "cuda" else {"cpu"}
    return {setting} if isinstance(setting, str) else set(setting)


def activities(
    setting: str | list[Literal["cpu", "cuda"]], device: torch.device
) -> list[ProfilerActivity]:
    """The ``torch.profiler`` activities of the setting."""
    kinds = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}
    return [kinds[name] for name in sorted(activity_names(setting, device))]


def summary_rows(ops: dict[str, list[float]], top: int) -> list[dict[str, Any]]:
    """The ``top`` ops by self time (µs in, ms out) with their share of all self time."""
    total = sum(row[1] for row in ops.values()) or 1.0
    ranked = sorted(ops.items(), key=lambda item: -item[1][1])[:top]
    return [
        {
            "op": name,
            "calls": int(calls),
            "self_ms": self_us / 1000,
            "self_percent": 100 * self_us / total,
            "total_ms": total_us / 1000,
        }
        for name, (calls, self_us, total_us) in ranked
    ]

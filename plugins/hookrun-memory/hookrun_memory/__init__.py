"""hookrun-memory: memory scalars at the core's log interval, and MMCV's EmptyCacheHook.

The scalars are gauges computed when the core reads its report: between reports the plugin
does nothing, so it adds no per-iteration hook call and no host-device sync. On an
accelerator they are the caching allocator's counters (no sync needed to read them); on the
CPU the process's resident set size and its peak (``VmRSS``, ``VmHWM`` of
``/proc/self/status``). Under torch.distributed every rank reads its own at each report iteration
and one all-reduce takes the maximum over ranks, rank 0 reporting it.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as torch_dist
from pydantic import Field

from hookrun import Plugin, PluginSettings, RunnerProtocol, hookimpl

__all__ = ["Memory", "MemorySettings"]

MIB = 2**20
ACCELERATOR_KEYS = ("allocated", "max_allocated", "reserved")
CPU_KEYS = ("rss", "max_rss")


class MemorySettings(PluginSettings):
    """Settings of the ``memory`` plugin."""

    scalars: bool = Field(
        True,
        description="Report `train/memory/*` (MiB) at every report of the core: on an "
        "accelerator `allocated`, `max_allocated` and `reserved`; on the CPU `rss` and "
        "`max_rss`.",
    )
    reset_peak: bool = Field(
        True,
        description="`max_allocated` is the peak since the previous report (true) or since "
        "training started (false). The CPU's `max_rss` is always the process's peak.",
    )
    empty_cache: list[Literal["before_epoch", "after_epoch", "after_iter"]] = Field(
        [],
        description="When to release the allocator's unused cached blocks, any of "
        "`before_epoch`, `after_epoch`, `after_iter` (MMCV's EmptyCacheHook); on the CPU a "
        "no-op with a one-time notice.",
    )


class Memory(Plugin[MemorySettings]):
    """Memory gauges read at each report; empties the allocator's cache where asked."""

    name = "memory"
    Settings = MemorySettings
    enabled_by_default = False

    def __init__(self, settings: MemorySettings | None = None) -> None:
        super().__init__(settings)
        self.peak = 0.0  # MiB, max_allocated since training started (reset_peak: false)
        self.reduced: torch.Tensor | None = None  # the last maximum over ranks
        self.snapshot: tuple[int, dict[str, float]] = (-1, {})  # (iteration, figures)
        self.noticed = False

    def unused_hooks(self, runner: RunnerProtocol) -> set[str]:
        """Only what is asked for runs: cache emptying, and per-report reductions under DDP."""
        when = self.settings.empty_cache
        unused = {
            f"{hook}_train_epoch" for hook in ("before", "after") if f"{hook}_epoch" not in when
        }
        if not ("after_iter" in when or (self.settings.scalars and runner.world_size > 1)):
            unused.add("after_train_iter")
        return unused

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        """Register the gauges, each computed when the core reads its report."""
        if not self.settings.scalars:
            return
        self.peak = 0.0
        for i, key in enumerate(keys_for(runner.device)):
            value = (
                Reading(self.reduced_value, i)
                if runner.world_size > 1
                else Reading(lambda key: self.figures(runner)[key], key)
            )
            runner.scalars.gauge(f"train/memory/{key}", value)

    @hookimpl
    def before_train_epoch(self, runner: RunnerProtocol) -> None:
        if "before_epoch" in self.settings.empty_cache:
            self.empty_cache(runner)

    @hookimpl
    def after_train_epoch(self, runner: RunnerProtocol) -> None:
        if "after_epoch" in self.settings.empty_cache:
            self.empty_cache(runner)

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        if "after_iter" in self.settings.empty_cache:
            self.empty_cache(runner)
        reports = runner.every_n_iters(runner.log_interval) or runner.is_last_iter()
        if self.settings.scalars and runner.world_size > 1 and reports:
            self.reduce(runner)

    # -- readings ------------------------------------------------------------------------

    def figures(self, runner: RunnerProtocol) -> dict[str, float]:
        """This report's figures, read once however many gauges ask."""
        at, figures = self.snapshot
        if at != runner.iter:
            figures = self.read(runner.device)
            self.snapshot = (runner.iter, figures)
        return figures

    def read(self, device: torch.device) -> dict[str, float]:
        """This process's figures in MiB. The peak since the previous report: on CUDA the
        core resets it after each report (for its own ``train/memory``), elsewhere this does."""
        if device.type == "cpu":
            return {"rss": rss_mib(), "max_rss": max_rss_mib()}
        peak = torch.accelerator.max_memory_allocated(device) / MIB
        if self.settings.reset_peak and device.type != "cuda":
            torch.accelerator.reset_peak_memory_stats(device)
        if not self.settings.reset_peak:
            self.peak = peak = max(self.peak, peak)
        return {
            "allocated": torch.accelerator.memory_allocated(device) / MIB,
            "max_allocated": peak,
            "reserved": torch.accelerator.memory_reserved(device) / MIB,
        }

    def reduce(self, runner: RunnerProtocol) -> None:
        """The maximum over ranks of every figure: one all-reduce at a report iteration."""
        device = runner.device
        values = self.read(device)
        on = device if torch_dist.get_backend() == "nccl" else torch.device("cpu")
        local = torch.tensor([values[k] for k in keys_for(device)], dtype=torch.float64, device=on)
        torch_dist.all_reduce(local, op=torch_dist.ReduceOp.MAX)
        self.reduced = local

    def reduced_value(self, index: int) -> float:
        """Rank 0's gauge under DDP: the last maximum over ranks (NaN before the first)."""
        return float(self.reduced[index]) if self.reduced is not None else float("nan")

    def empty_cache(self, runner: RunnerProtocol) -> None:
        """Release the accelerator allocator's unused blocks (nothing to do on the CPU)."""
        device = runner.device
        if device.type != "cpu":
            torch.accelerator.empty_cache()
        elif not self.noticed:
            self.noticed = True
            runner.info("memory: empty_cache does nothing on the CPU (no caching allocator)")


class Reading:
    """A gauge computed when the core reads its report (``ScalarStore`` calls ``float``):
    ``compute(which)``."""

    __slots__ = ("compute", "which")

    def __init__(self, compute: Callable[[Any], float], which: Any) -> None:
        self.compute = compute
        self.which = which

    def __float__(self) -> float:
        return float(self.compute(self.which))


def keys_for(device: torch.device) -> tuple[str, ...]:
    return CPU_KEYS if device.type == "cpu" else ACCELERATOR_KEYS


def rss_mib() -> float:
    """The resident set size now (``VmRSS``), or the peak where ``/proc`` has none."""
    return proc_status().get("VmRSS", max_rss_mib())


def max_rss_mib() -> float:
    """The process's peak resident set size: ``VmHWM`` (the same accounting as ``VmRSS``),
    else ``getrusage`` (KiB on Linux, bytes on macOS)."""
    if "VmHWM" in (status := proc_status()):
        return status["VmHWM"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024


def proc_status() -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``/proc/self/status`` in MiB (empty without ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            lines = status.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM") and value.strip().endswith("kB"):
            found[key] = int(value.split()[0]) / 1024
    return found

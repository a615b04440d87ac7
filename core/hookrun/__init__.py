"""hookrun: a PyTorch training runner whose hook points are pluggy hookspecs.

Attributes are imported on first use so that ``hookrun plugins list`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Runner": "hookrun.engine.runner",
    "Plugin": "hookrun.hooks.plugin",
    "PluginSettings": "hookrun.hooks.plugin",
    "Priority": "hookrun.hooks.plugin",
    "hookimpl": "hookrun.hooks.plugin",
    "Writer": "hookrun.writers.base",
    "image_uint8": "hookrun.writers.base",
    "TrackerWriter": "hookrun.writers.tracker",
    "checkpoint_files": "hookrun.writers.tracker",
    "checkpoint_signature": "hookrun.writers.tracker",
    "CHECKPOINT_CHOICES": "hookrun.writers.tracker",
    "ScalarStore": "hookrun.engine.scalars",
    "is_distributed": "hookrun.distributed.collectives",
    "get_rank": "hookrun.distributed.collectives",
    "get_world_size": "hookrun.distributed.collectives",
    "barrier": "hookrun.distributed.collectives",
    "any_rank": "hookrun.distributed.collectives",
    "all_reduce_sum": "hookrun.distributed.collectives",
    "all_reduce_max": "hookrun.distributed.collectives",
    "broadcast_from_rank_0": "hookrun.distributed.collectives",
    "all_gather_object": "hookrun.distributed.collectives",
    "rank_zero_only": "hookrun.distributed.collectives",
    "is_dtensor": "hookrun.distributed.fsdp",
    "local_shard": "hookrun.distributed.fsdp",
    "HookrunError": "hookrun.errors",
    "ConfigError": "hookrun.errors",
    "PluginError": "hookrun.errors",
    "CheckpointError": "hookrun.errors",
    "CheckpointMismatchError": "hookrun.errors",
    "metric_rule": "hookrun.direction",
    "better": "hookrun.direction",
    "resolve_rule": "hookrun.direction",
    "format_duration": "hookrun.cli.numbers",
    "format_number": "hookrun.cli.numbers",
    "format_scalar": "hookrun.cli.numbers",
    "report_line": "hookrun.engine.reporting",
    "epoch_label": "hookrun.engine.reporting",
    "metrics_line": "hookrun.engine.reporting",
    "write_line": "hookrun.engine.reporting",
    "Pace": "hookrun.engine.reporting",
    "batch_size": "hookrun.data.batches",
    "RunnerProtocol": "hookrun.hooks.protocol",
    "LoopPosition": "hookrun.engine.position",
    "Phase": "hookrun.engine.position",
    "HookStats": "hookrun.hooks.stats",
    "mix_seed": "hookrun.data.loaders",
    "loader_options": "hookrun.data.loaders",
    "atomic_write_text": "hookrun.checkpoint.files",
    "already_sharded": "hookrun.data.sharding",
    "checkpoint_state_file": "hookrun.checkpoint.files",
    "remove_checkpoint": "hookrun.checkpoint.files",
    "created_by_hookrun": "hookrun.engine.workdir_hold",
    "URL": "hookrun.checkpoint.storage",
    "location": "hookrun.checkpoint.storage",
    "url_problem": "hookrun.checkpoint.storage",
    "SwapStack": "hookrun.engine.swaps",
    "swap_stack": "hookrun.engine.swaps",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from hookrun.checkpoint.files import atomic_write_text as atomic_write_text
    from hookrun.checkpoint.files import checkpoint_state_file as checkpoint_state_file
    from hookrun.checkpoint.files import remove_checkpoint as remove_checkpoint
    from hookrun.checkpoint.storage import URL as URL
    from hookrun.checkpoint.storage import location as location
    from hookrun.checkpoint.storage import url_problem as url_problem
    from hookrun.cli.numbers import format_duration as format_duration
    from hookrun.cli.numbers import format_number as format_number
    from hookrun.cli.numbers import format_scalar as format_scalar
    from hookrun.data.batches import batch_size as batch_size
    from hookrun.data.loaders import loader_options as loader_options
    from hookrun.data.loaders import mix_seed as mix_seed
    from hookrun.data.sharding import already_sharded as already_sharded
    from hookrun.direction import better as better
    from hookrun.direction import metric_rule as metric_rule
    from hookrun.direction import resolve_rule as resolve_rule
    from hookrun.distributed.collectives import all_gather_object as all_gather_object
    from hookrun.distributed.collectives import all_reduce_max as all_reduce_max
    from hookrun.distributed.collectives import all_reduce_sum as all_reduce_sum
    from hookrun.distributed.collectives import any_rank as any_rank
    from hookrun.distributed.collectives import barrier as barrier
    from hookrun.distributed.collectives import broadcast_from_rank_0 as broadcast_from_rank_0
    from hookrun.distributed.collectives import get_rank as get_rank
    from hookrun.distributed.collectives import get_world_size as get_world_size
    from hookrun.distributed.collectives import is_distributed as is_distributed
    from hookrun.distributed.collectives import rank_zero_only as rank_zero_only
    from hookrun.distributed.fsdp import is_dtensor as is_dtensor
    from hookrun.distributed.fsdp import local_shard as local_shard
    from hookrun.engine.position import LoopPosition as LoopPosition
    from hookrun.engine.position import Phase as Phase
    from hookrun.engine.reporting import Pace as Pace
    from hookrun.engine.reporting import epoch_label as epoch_label
    from hookrun.engine.reporting import metrics_line as metrics_line
    from hookrun.engine.reporting import report_line as report_line
    from hookrun.engine.reporting import write_line as write_line
    from hookrun.engine.runner import Runner as Runner
    from hookrun.engine.scalars import ScalarStore as ScalarStore
    from hookrun.engine.swaps import SwapStack as SwapStack
    from hookrun.engine.swaps import swap_stack as swap_stack
    from hookrun.engine.workdir_hold import created_by_hookrun as created_by_hookrun
    from hookrun.errors import CheckpointError as CheckpointError
    from hookrun.errors import CheckpointMismatchError as CheckpointMismatchError
    from hookrun.errors import ConfigError as ConfigError
    from hookrun.errors import HookrunError as HookrunError
    from hookrun.errors import PluginError as PluginError
    from hookrun.hooks.plugin import Plugin as Plugin
    from hookrun.hooks.plugin import PluginSettings as PluginSettings
    from hookrun.hooks.plugin import Priority as Priority
    from hookrun.hooks.plugin import hookimpl as hookimpl
    from hookrun.hooks.protocol import RunnerProtocol as RunnerProtocol
    from hookrun.hooks.stats import HookStats as HookStats
    from hookrun.writers.base import Writer as Writer
    from hookrun.writers.base import image_uint8 as image_uint8
    from hookrun.writers.tracker import CHECKPOINT_CHOICES as CHECKPOINT_CHOICES
    from hookrun.writers.tracker import TrackerWriter as TrackerWriter
    from hookrun.writers.tracker import checkpoint_files as checkpoint_files
    from hookrun.writers.tracker import checkpoint_signature as checkpoint_signature


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

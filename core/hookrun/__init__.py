"""hookrun: a PyTorch training runner whose hook points are pluggy hookspecs.

Attributes are imported on first use so that ``hookrun plugins list`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Runner": "hookrun.runner",
    "Plugin": "hookrun.plugin",
    "PluginSettings": "hookrun.plugin",
    "Priority": "hookrun.plugin",
    "hookimpl": "hookrun.plugin",
    "Writer": "hookrun.writers",
    "image_uint8": "hookrun.writers",
    "checkpoint_files": "hookrun.writers",
    "checkpoint_signature": "hookrun.writers",
    "CHECKPOINT_CHOICES": "hookrun.writers",
    "ScalarStore": "hookrun.scalars",
    "is_distributed": "hookrun.collectives",
    "get_rank": "hookrun.collectives",
    "get_world_size": "hookrun.collectives",
    "barrier": "hookrun.collectives",
    "any_rank": "hookrun.collectives",
    "all_reduce_sum": "hookrun.collectives",
    "all_reduce_max": "hookrun.collectives",
    "broadcast_from_rank_0": "hookrun.collectives",
    "all_gather_object": "hookrun.collectives",
    "rank_zero_only": "hookrun.collectives",
    "HookrunError": "hookrun.errors",
    "ConfigError": "hookrun.errors",
    "PluginError": "hookrun.errors",
    "CheckpointError": "hookrun.errors",
    "CheckpointMismatchError": "hookrun.errors",
    "metric_rule": "hookrun.direction",
    "better": "hookrun.direction",
    "resolve_rule": "hookrun.direction",
    "format_duration": "hookrun.timefmt",
    "batch_size": "hookrun.steps",
    "RunnerProtocol": "hookrun.surface",
    "LoopPosition": "hookrun.loop",
    "Phase": "hookrun.loop",
    "HookStats": "hookrun.hook_stats",
    "mix_seed": "hookrun.data",
    "loader_options": "hookrun.data",
    "atomic_write_text": "hookrun.checkpoint",
    "already_sharded": "hookrun.sharding",
    "checkpoint_state_file": "hookrun.checkpoint",
    "remove_checkpoint": "hookrun.checkpoint",
    "SwapStack": "hookrun.swaps",
    "swap_stack": "hookrun.swaps",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from hookrun.checkpoint import atomic_write_text as atomic_write_text
    from hookrun.checkpoint import checkpoint_state_file as checkpoint_state_file
    from hookrun.checkpoint import remove_checkpoint as remove_checkpoint
    from hookrun.collectives import all_gather_object as all_gather_object
    from hookrun.collectives import all_reduce_max as all_reduce_max
    from hookrun.collectives import all_reduce_sum as all_reduce_sum
    from hookrun.collectives import any_rank as any_rank
    from hookrun.collectives import barrier as barrier
    from hookrun.collectives import broadcast_from_rank_0 as broadcast_from_rank_0
    from hookrun.collectives import get_rank as get_rank
    from hookrun.collectives import get_world_size as get_world_size
    from hookrun.collectives import is_distributed as is_distributed
    from hookrun.collectives import rank_zero_only as rank_zero_only
    from hookrun.data import loader_options as loader_options
    from hookrun.data import mix_seed as mix_seed
    from hookrun.direction import better as better
    from hookrun.direction import metric_rule as metric_rule
    from hookrun.direction import resolve_rule as resolve_rule
    from hookrun.errors import CheckpointError as CheckpointError
    from hookrun.errors import CheckpointMismatchError as CheckpointMismatchError
    from hookrun.errors import ConfigError as ConfigError
    from hookrun.errors import HookrunError as HookrunError
    from hookrun.errors import PluginError as PluginError
    from hookrun.hook_stats import HookStats as HookStats
    from hookrun.loop import LoopPosition as LoopPosition
    from hookrun.loop import Phase as Phase
    from hookrun.plugin import Plugin as Plugin
    from hookrun.plugin import PluginSettings as PluginSettings
    from hookrun.plugin import Priority as Priority
    from hookrun.plugin import hookimpl as hookimpl
    from hookrun.runner import Runner as Runner
    from hookrun.scalars import ScalarStore as ScalarStore
    from hookrun.sharding import already_sharded as already_sharded
    from hookrun.steps import batch_size as batch_size
    from hookrun.surface import RunnerProtocol as RunnerProtocol
    from hookrun.swaps import SwapStack as SwapStack
    from hookrun.swaps import swap_stack as swap_stack
    from hookrun.timefmt import format_duration as format_duration
    from hookrun.writers import CHECKPOINT_CHOICES as CHECKPOINT_CHOICES
    from hookrun.writers import Writer as Writer
    from hookrun.writers import checkpoint_files as checkpoint_files
    from hookrun.writers import checkpoint_signature as checkpoint_signature
    from hookrun.writers import image_uint8 as image_uint8


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hookrun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

"""``hookrun export CHECKPOINT OUT.pt``: one consolidated weights file from any checkpoint.

The file holds the plain state dict of the model (or, with ``ema``, the weights the EMA
plugin's :meth:`~hookrun.Plugin.export_weights` finds in its state), every tensor whole,
loadable with ``torch.load(OUT, weights_only=True)`` into the model as it is built without
hookrun: what a checkpoint file holds as ``model``, or what the shards of a sharded folder
add up to (read in this one process, no torchrun needed), under plain names also where a
checkpoint's carry ``torch.compile``'s ``_orig_mod.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hookrun.checkpoint import files as ckpt_io
from hookrun.config.file import place_errors
from hookrun.engine.compiled import plain_names
from hookrun.errors import CheckpointMismatchError, HookrunError
from hookrun.hooks.discovery import installed_plugins, unknown_plugin_message


def export(checkpoint: Path, out: Path, ema: bool = False) -> int:
    """Write ``checkpoint``'s weights to ``out`` atomically; the number of entries written.

    A checkpoint that is missing or does not load, ``--ema`` on a checkpoint without EMA
    weights, an ``out`` hookrun cannot write (a folder, below a file: :func:`place_errors`)
    or the checkpoint itself is one error line, found before anything is written.
    """
    if not checkpoint.exists():
        raise CheckpointMismatchError(
            f"checkpoint not found: {checkpoint}", path=checkpoint, reason="file not found"
        )
    errors = place_errors("OUT", out, folder=False)
    if errors:
        raise HookrunError(errors)
    if out.resolve() == checkpoint.resolve():
        raise HookrunError(f"OUT: {out} is the checkpoint itself; name another file")
    found = weights(checkpoint, ema)
    ckpt_io.atomic_save(found, out)
    return len(found)


def weights(checkpoint: Path, ema: bool) -> dict[str, torch.Tensor]:
    """The model's weights in ``checkpoint`` (a file or a sharded folder), every tensor
    whole; with ``ema`` the EMA plugin's average instead (one line when there is none)."""
    if checkpoint.is_dir():
        from hookrun.checkpoint import sharded

        state = sharded.load(checkpoint)  # checks the folder: complete, DCP's metadata
        if not ema:
            return sharded.full_model_state(checkpoint)
        state["plugins"] = sharded.full_plugin_states(checkpoint, state)  # the average's shards
    else:
        state = ckpt_io.load(checkpoint)
        if not ema:
            return plain_names(state["model"])
    return plain_names(_plugin_weights(checkpoint, state, "ema"))


def _plugin_weights(checkpoint: Path, state: dict[str, Any], name: str) -> dict[str, Any]:
    """The weights plugin ``name`` exports from its state in ``state`` (its
    :meth:`~hookrun.Plugin.export_weights`), or one error line when there are none."""
    plugin_state = state.get("plugins", {}).get(name)
    found = installed_plugins().get(name)
    if found is None:
        raise HookrunError(unknown_plugin_message(name, f"--{name}", installed_plugins()))
    weights = found.entry_point.load().export_weights(plugin_state) if plugin_state else None
    if not isinstance(weights, dict):
        raise HookrunError(
            f"--{name}: checkpoint {checkpoint} holds no {name.upper()} weights "
            f"(the {name} plugin was not on)"
        )
    return dict(weights)

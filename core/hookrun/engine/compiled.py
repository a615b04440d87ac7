"""Compiled models (docs/compiled-models.md): the model is compiled in place, so the module
hookrun trains, saves and hands to plugins keeps its plain parameter names.

``torch.compile(model)`` returns a wrapper (``OptimizedModule``) whose state dict names carry
``_orig_mod.`` and whose ``training_step`` is the original module's, run eager. hookrun
therefore trains the wrapped module itself, compiled in place with the wrapper's own
compiler settings, and reads checkpoints' ``_orig_mod.`` names as the plain ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

ORIG_MOD = "_orig_mod."
"""What ``torch.compile(model)`` puts into the names of the module it wraps."""


def prepare(model: nn.Module, compile: bool | Mapping[str, Any]) -> nn.Module:
    """The module to train: every ``torch.compile`` wrapper in ``model`` (the model itself
    or a submodule) replaced by the module it wraps, compiled in place with the wrapper's
    settings; with ``compile`` (True or ``torch.compile``'s options) the whole model
    compiled in place (``module.compile()``), so its ``__call__`` runs compiled, also from
    its own ``training_step``."""
    model = _unwrapped(model)
    if compile is not False:
        model.compile(**({} if compile is True else dict(compile)))
    return model


def _unwrapped(module: nn.Module) -> nn.Module:
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(module, OptimizedModule):
        wrapper, module = module, module._orig_mod
        # what module.compile() does, with the context torch.compile built from its options
        module._compiled_call_impl = wrapper.dynamo_ctx(module._call_impl)
    for name, child in list(module.named_children()):
        plain = _unwrapped(child)
        if plain is not child:
            setattr(module, name, plain)
    return module


def plain_names(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (a model's state dict) with ``torch.compile``'s ``_orig_mod.`` taken out of
    every name, wherever in the name a wrapped submodule put it."""
    return {
        key.replace(ORIG_MOD, "") if isinstance(key, str) else key: value
        for key, value in state.items()
    }

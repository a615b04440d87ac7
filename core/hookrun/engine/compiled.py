"""Compiled models (docs/compiled-models.md): the model is compiled in place, so the module
hookrun trains, saves and hands to plugins keeps its plain parameter names.

``torch.compile(model)`` returns a wrapper (``OptimizedModule``) whose state dict names carry
``_orig_mod.`` and whose ``training_step`` is the original module's, run eager. hookrun
therefore trains the wrapped module itself, compiled in place with the wrapper's own
compiler settings, and reads checkpoints' ``_orig_mod.`` names as the plain ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

ORIG_MOD = "_orig_mod."
"""What ``torch.compile(model)`` puts into the names of the module it wraps."""


def prepare(model: nn.Module, compile: bool | Mapping[str, Any]) -> nn.Module:
    """The module to train: every ``torch.compile`` wrapper in ``model`` (the model itself
    or a submodule) replaced by the module it wraps, compiled in place with the wrapper's
    settings; with ``compile`` (True or ``torch.compile``'s options) the whole model
    compiled in place, so its ``__call__`` runs compiled, also from its own
    ``training_step``."""
    import torch

    # a wrapper exists only once torch.compile loaded dynamo (whose import takes seconds)
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    if dynamo is not None:
        model = _unwrapped(model, dynamo.OptimizedModule)
    if compile is not False:
        options = _options(compile)
        _compile_in_place(model, lambda fn: torch.compile(fn, **options))
    return model


def compile_sharded(model: nn.Module, compile: bool | Mapping[str, Any]) -> None:
    """Under FSDP: the forward of every sharded module that holds no other sharded module
    compiled in place (a per-block compile, as torchtitan does), its FSDP hooks left outside
    the compiled code. Dynamo cannot trace those hooks: the whole sharded model compiled,
    before or after sharding, runs every frame eager. Code of the model outside the
    innermost units (the root's own layers around them) runs eager."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    if compile is False:
        return
    options = _options(compile)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        if not any(isinstance(m, FSDPModule) for m in unit.modules() if m is not unit):
            unit.forward = torch.compile(unit.forward, **options)


def _options(compile: bool | Mapping[str, Any]) -> dict[str, Any]:
    """``torch.compile``'s keyword arguments from ``runner.compile`` (True: its defaults)."""
    return {} if compile is True else dict(compile)  # type: ignore[arg-type]


def _compile_in_place(module: nn.Module, compiler: Callable[[Any], Any]) -> None:
    """What ``module.compile()`` does, through a function of hookrun's: dynamo skips
    ``_call_impl`` handed over itself when the forward is torch's own (``nn.Linear``,
    ``nn.Sequential``) and would then compile nothing."""
    call = module._call_impl

    def call_impl(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    module._compiled_call_impl = compiler(call_impl)


def _unwrapped(module: nn.Module, wrapper_class: type) -> nn.Module:
    if isinstance(module, wrapper_class):
        wrapper: Any = module
        module = wrapper._orig_mod
        _compile_in_place(module, wrapper.dynamo_ctx)  # the context torch.compile built
    for name, child in list(module.named_children()):
        plain = _unwrapped(child, wrapper_class)
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

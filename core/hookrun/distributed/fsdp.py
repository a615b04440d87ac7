"""``strategy: fsdp``: FSDP2 (``fully_shard``) over every rank, and what the runner does
differently for it (clipping sharded gradients, evaluation in lockstep, full weights).

The model is sharded in place: the runner's training step, hook points and loop are the
ones DDP runs; only where the parameters live changes (each rank holds a ``DTensor`` shard).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

from hookrun.config.arguments import FsdpSettings
from hookrun.distributed import collectives
from hookrun.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def shard_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    settings: FsdpSettings | None,
    device: torch.device,
    amp: str | None,
) -> nn.Module:
    """Shard ``model`` in place over every rank: ``fully_shard`` on the submodules named in
    ``settings.wrap`` or chosen by ``settings.min_params``, then on the root.

    ``fully_shard`` replaces each parameter with a new ``DTensor`` one, so an optimizer
    built on the model's parameters beforehand has its groups pointed at the new ones.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    settings = settings or FsdpSettings.model_validate({})
    units = units_to_shard(model, settings)
    names = {id(p): name for name, p in model.named_parameters()}
    mesh = init_device_mesh(device.type, (collectives.get_world_size(),))
    policy = (
        MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32
        )
        if amp == "bf16"
        else MixedPrecisionPolicy()
    )
    options: dict[str, Any] = {
        "mesh": mesh,
        # None: PyTorch's default, which keeps the root gathered from forward to backward
        # (it is needed first there); False: every unit stays gathered
        "reshard_after_forward": None if settings.reshard_after_forward else False,
        "mp_policy": policy,
        "offload_policy": CPUOffloadPolicy() if settings.cpu_offload else OffloadPolicy(),
    }
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    if optimizer is not None:
        _repoint(optimizer, names, dict(model.named_parameters()))
    return model


def units_to_shard(model: nn.Module, settings: FsdpSettings) -> list[nn.Module]:
    """The submodules (not the root) that become units of their own, innermost first.

    A class name in ``wrap`` that no submodule has is a config error naming the classes
    the model has.
    """
    found = {type(m).__name__ for _, m in model.named_modules() if m is not model}
    missing = [name for name in settings.wrap if name not in found]
    if missing:
        known = ", ".join(sorted(found)) or "none"
        raise ConfigError(
            f"runner.fsdp.wrap: no submodule of class {missing[0]!r} in the model "
            f"(its classes: {known})"
        )
    wanted = set(settings.wrap)
    units: list[nn.Module] = []
    taken: set[int] = set()  # parameters already in a unit
    for module in _post_order(model):
        if module is model:
            continue
        if type(module).__name__ in wanted:
            units.append(module)
        elif settings.min_params is not None:
            free = sum(p.numel() for p in module.parameters() if id(p) not in taken)
            if free < settings.min_params:
                continue
            units.append(module)
        else:
            continue
        taken.update(id(p) for p in module.parameters())
    return units


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _repoint(
    optimizer: torch.optim.Optimizer, names: Mapping[int, str], params: Mapping[str, nn.Parameter]
) -> None:
    """Point ``optimizer``'s groups (and any state) at the sharded parameters; a parameter
    the optimizer holds that is not the model's is a config error."""
    swapped: dict[int, nn.Parameter] = {}
    for group in optimizer.param_groups:
        for i, old in enumerate(group["params"]):
            if id(old) not in names:
                raise ConfigError(
                    "runner.optimizer: it holds a parameter that is not the model's; "
                    "strategy fsdp shards the model's parameters only"
                )
            new = params[names[id(old)]]
            swapped[id(old)] = new
            group["params"][i] = new
    moved = {swapped.get(id(p), p): s for p, s in optimizer.state.items()}
    optimizer.state.clear()
    optimizer.state.update(moved)


def is_dtensor(tensor: Any) -> TypeGuard[DTensor]:
    """Whether ``tensor`` is a ``DTensor`` (an FSDP shard). None exists before something
    (FSDP) loaded ``torch.distributed.tensor``, so this asks only once it is loaded: its
    import, about half a second, stays out of the start-up of runs that shard nothing."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: a ``DTensor``'s local shard, else ``tensor`` itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def clip_grad_norm_(
    parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """``nn.utils.clip_grad_norm_`` over sharded gradients: the total norm of the whole
    model (every rank's shards), and every shard scaled by the same factor."""
    params = [p for p in parameters if p.grad is not None]
    norm = nn.utils.get_total_norm([p.grad for p in params], norm_type)  # type: ignore[misc]
    if is_dtensor(norm):
        norm = norm.full_tensor()
    nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def lockstep(batches: Iterable[Any], count: int) -> Iterator[tuple[Any, bool]]:
    """``(batch, counted)``: every rank runs as many forwards as the rank with the most
    batches (each forward gathers parameters with every peer), repeating its last batch
    uncounted. A rank with no batch at all cannot join in: that is a config error."""
    most, least = collectives.all_reduce_max(torch.tensor([count, -count])).tolist()
    fewest = -least
    if fewest == 0 and most > 0:
        raise ConfigError(
            "strategy fsdp: an evaluation loader gives some rank no batch at all (fewer "
            "samples than ranks); every rank must run each forward"
        )
    last = None
    for last in batches:
        yield last, True
    for _ in range(most - count):
        yield last, False


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The plain state dict of the whole model on every rank (a collective: every rank
    calls it), as the unwrapped model's ``state_dict`` would be."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return dict(get_model_state_dict(model, options=options))  # type: ignore[arg-type]

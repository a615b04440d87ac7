"""The partial gradients of an open accumulation group, kept in a checkpoint taken inside it
(your own ``save_checkpoint`` from ``after_train_iter``, say) so that it resumes exactly: each
parameter's gradient so far and, with ``grad_accum_normalize: items``, the items counted so
far. The checkpoint plugin's saves and a stop's save wait for the group's end instead, and
hold none.

Under DDP each rank's partial gradients differ: the checkpoint keeps their mean over the
ranks, which every rank takes back. The group's step averages the ranks' gradients, so it
reaches the same sum (up to the order of the additions). Under FSDP nothing is kept (a
limit, docs/resume.md).
"""

from __future__ import annotations

from typing import Any

import torch

from hookrun.checkpoint.checkpointable import Checkpointable
from hookrun.distributed import collectives
from hookrun.engine.compiled import plain_names
from hookrun.engine.position import Phase


def group_open(runner: Checkpointable) -> bool:
    """Whether the position lies inside an accumulation group that has not stepped: some of
    its batches are done and their gradients wait for the rest (the same answer on every
    rank: it reads only the position)."""
    pos = runner.position
    if runner.grad_accum == 1 or pos.phase is not Phase.TRAIN:
        return False
    if pos.iter_ending and pos.closes_group:  # after_train_iter of the step that closed it
        return False
    return pos.batch % runner.grad_accum != 0


def partial_gradients(runner: Checkpointable) -> dict[str, Any] | None:
    """``{"grads": {name: gradient}, "items": n}`` for a checkpoint taken inside an open
    group (every rank calls it: under DDP the gradients are averaged over the ranks), or
    None when no group is open or the model is sharded."""
    if runner.strategy == "fsdp" or not group_open(runner):
        return None
    params = [(n, p) for n, p in runner.unwrapped_model.named_parameters() if p.grad is not None]
    grads = [p.grad.detach().clone() for _, p in params if p.grad is not None]
    items = torch.as_tensor(runner.optimizer_step.items, dtype=torch.float64)
    if runner.world_size > 1:
        world = runner.world_size
        grads = [collectives.all_reduce_sum(g) / world for g in grads]
        items = collectives.all_reduce_sum(items.to(runner.device)).cpu() / world
    names = [n for n, _ in params]
    return {"grads": plain_names(dict(zip(names, grads, strict=True))), "items": float(items)}


def restore_partial_gradients(runner: Checkpointable, saved: dict[str, Any]) -> None:
    """Give each parameter its saved partial gradient and the step its items so far."""
    params = dict(runner.unwrapped_model.named_parameters())
    for name, grad in saved.get("grads", {}).items():
        param = params.get(name)
        if param is not None:
            param.grad = grad.to(device=param.device, dtype=param.dtype)
    runner.optimizer_step.items = saved.get("items", 0)

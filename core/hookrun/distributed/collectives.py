"""Collectives for plugins and tasks: each is a no-op (or the plain value) in a single
process, so code written for one process runs unchanged under torchrun. Public on purpose
(``hookrun.__all__``);
joining the process group stays in :mod:`hookrun.distributed.process_group`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

F = TypeVar("F", bound=Callable[..., Any])


def is_distributed() -> bool:
    """Whether this process is one of several in a process group."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    """This process's rank (0 in a single process)."""
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    """How many processes train together (1 in a single process)."""
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
    """Wait until every rank gets here (a no-op in a single process)."""
    if is_distributed():
        dist.barrier()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank; also a barrier (a plain bool outside torchrun)."""
    if not is_distributed():
        return flag
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op in a single process)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of ``tensor`` over ranks, in place (a no-op in a single process)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_from_rank_0(tensor: torch.Tensor) -> None:
    """Give every rank rank 0's ``tensor``, in place (a no-op in a single process). A CPU
    tensor under nccl travels through the current CUDA device."""
    if not is_distributed():
        return
    if tensor.device.type == "cpu" and dist.get_backend() == "nccl":
        staged = tensor.cuda()
        dist.broadcast(staged, src=0)
        tensor.copy_(staged)
    else:
        dist.broadcast(tensor, src=0)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def rank_zero_only(fn: F) -> F:
    """Run ``fn`` on rank 0 only; other ranks get ``None``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if get_rank() == 0 else None

    return wrapper  # type: ignore[return-value]

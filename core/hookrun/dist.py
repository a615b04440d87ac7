"""torch.distributed helpers: set up from torchrun's environment, rank checks, reductions."""

from __future__ import annotations

import atexit
import functools
import gc
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

F = TypeVar("F", bound=Callable[..., Any])


def init_from_env(timeout_s: float = 300.0) -> tuple[int, int, int]:
    """Join the process group torchrun describes (nccl with CUDA, gloo without).

    Returns ``(rank, world_size, local_rank)``; ``(0, 1, 0)`` outside torchrun.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    atexit.register(_leave_process_group)
    return dist.get_rank(), dist.get_world_size(), local_rank


def _leave_process_group() -> None:
    """Free unreachable runners (their DDP wrapper holds the group) and tear the group down
    while the interpreter still runs. Left to its shutdown, a gloo worker thread that drops
    the last reference to a tensor needs the GIL after Python stopped handing it out, and the
    process aborts after a finished run ("terminate called without an active exception")."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def barrier() -> None:
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
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart after the last
    forward of DDP, which only broadcasts them at the start of each forward)."""
    if is_distributed():
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)


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

"""The process group, private to hookrun: joined from the launcher's environment, the peers
on this node watched, errors agreed across ranks. The collectives plugins may use are in
:mod:`hookrun.distributed.collectives`."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import socket
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hookrun.distributed import cluster
from hookrun.distributed.collectives import (
    all_gather_object,
    broadcast_from_rank_0,
    get_rank,
    is_distributed,
)
from hookrun.errors import HookrunError, first_line


def init_from_env(timeout_s: float = 600.0) -> tuple[int, int, int]:
    """Join the process group the launcher describes (torchrun, or ``srun`` under SLURM:
    see :mod:`hookrun.distributed.cluster`), nccl with CUDA, gloo without; ``timeout_s`` bounds its
    creation and every collective on it.

    Returns ``(rank, world_size, local_rank)``; ``(0, 1, 0)`` outside a launch.
    """
    env = cluster.launch_env()
    local_rank = int(env.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), local_rank
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1, 0
    os.environ.update(env)  # SLURM's under torchrun's names, for torch and the user's code
    rank = int(env["RANK"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    store = _store(env, rank, world_size, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    atexit.register(_leave_process_group)
    return rank, world_size, local_rank


def _store(env: dict[str, str], rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The rendezvous store, its keys prefixed by torchrun's attempt number: a restarted
    attempt must not read the addresses the dead attempt left in the agent's store. Under
    torchrun the agent hosts the store; otherwise (SLURM) rank 0 does."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    tcp = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not agent,
        timeout=timeout,
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"hookrun/attempt_{attempt}", tcp)


def _leave_process_group() -> None:
    """Free unreachable runners (their DDP wrapper holds the group) and tear the group down
    while the interpreter still runs. Left to its shutdown, a gloo worker thread that drops
    the last reference to a tensor needs the GIL after Python stopped handing it out, and the
    process aborts after a finished run ("terminate called without an active exception")."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart after the last
    forward of DDP, which only broadcasts them at the start of each forward)."""
    for buffer in module.buffers():
        broadcast_from_rank_0(buffer)


def node_peers() -> dict[int, int]:
    """The other ranks on this node, rank to process id (one gather; empty outside a
    multi-process run): their liveness is what a rank can see without a collective."""
    if not is_distributed():
        return {}
    rank = get_rank()
    found = all_gather_object((_node(), os.getpid()))
    return {r: pid for r, (node, pid) in enumerate(found) if node == found[rank][0] and r != rank}


def _node() -> str:
    """This node's name and PID namespace: process ids compare within one namespace only."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()} {namespace}"


def ended(peers: Mapping[int, int]) -> list[int]:
    """The ranks of ``peers`` (rank to process id, on this node) whose process has ended."""
    return [rank for rank, pid in peers.items() if not _running(pid)]


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (ended, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc to tell a zombie by
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


class PeerFailed(RuntimeError):
    """Another rank failed (not with a user mistake) where the ranks compare their errors."""


@contextlib.contextmanager
def errors_agreed() -> Iterator[None]:
    """Run a block of checks on every rank, then compare: when the block failed on any rank,
    every rank fails, so no rank goes on to wait for a rank that has given up.

    A rank that failed re-raises its own error; the others raise one line naming the first
    rank that failed, a :class:`~hookrun.errors.HookrunError` when that rank's error was a
    user mistake (exit code 2 from the CLI on every rank), :class:`PeerFailed` otherwise.
    One gather of a short string: for set-up checks, never in a training iteration.
    """
    if not is_distributed():
        yield
        return
    error: BaseException | None = None
    try:
        yield
    except Exception as exc:
        error = exc
    mine = None
    if error is not None:
        mine = (isinstance(error, HookrunError), first_line(error) or type(error).__name__)
    found = all_gather_object(mine)
    if error is not None:
        raise error
    for rank, entry in enumerate(found):
        if entry is not None:
            user, line = entry
            message = f"stopped: rank {rank} failed: {line}"
            raise HookrunError(message) if user else PeerFailed(message)

"""Where this process stands in a multi-process launch, read from the launcher's environment.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
``srun`` under SLURM sets ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the node
list, which :func:`slurm_env` maps to torchrun's names. Standard library only: the CLI asks
for the rank (to prefix its error lines) before it imports torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 20000
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def slurm_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """torchrun's variables derived from SLURM's, for a job started by ``srun`` without
    torchrun; empty when torchrun's ``WORLD_SIZE`` is set or SLURM's task variables are not.

    The master address is the first host of ``SLURM_JOB_NODELIST`` and the port
    ``20000 + job id % 20000``; a ``MASTER_ADDR`` or ``MASTER_PORT`` already set wins.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return {}
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
    job_id = int(env.get("SLURM_JOB_ID", "0") or 0)
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_host(nodes),
        "MASTER_PORT": env.get("MASTER_PORT") or str(SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN),
    }


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[07-09,12],cpu1`` gives ``gpu07``."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        raise ValueError(f"SLURM node list {nodelist!r} names no host")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def launch_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """torchrun's variables as this process sees them (SLURM's mapped when torchrun's are
    not set); missing keys are absent."""
    env = os.environ if environ is None else environ
    mapped = slurm_env(env)
    return mapped or {key: env[key] for key in TORCHRUN_KEYS if key in env}


def env_rank() -> int:
    """This process's rank by the launcher's environment (0 outside a launch)."""
    return int(launch_env().get("RANK", "0") or 0)


def env_world_size() -> int:
    """The number of processes the launcher started (1 outside a launch)."""
    return int(launch_env().get("WORLD_SIZE", "1") or 1)


def rank_prefix() -> str:
    """``[rank N] `` in a multi-process launch, empty otherwise: every rank prints its own
    errors, and the prefix says whose they are."""
    return f"[rank {env_rank()}] " if env_world_size() > 1 else ""

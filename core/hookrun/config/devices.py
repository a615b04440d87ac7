"""The run's device: ``runner.device`` resolved (``auto``: this rank's GPU, else the CPU) and
checked against what the run asks of it, so a device that is not there, or a setting it
cannot serve, is a config line before any work starts.
"""

from __future__ import annotations

import torch

from hookrun.errors import ConfigError


def resolve_device(device: str | torch.device, local_rank: int) -> torch.device:
    """The run's device; a device that is not there (no CUDA, an index beyond the GPUs,
    ``meta``) is a config error found before any work starts."""
    if str(device) == "auto":
        return (
            torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        )
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"runner.device: {exc} (got {str(device)!r})") from None
    problem = _missing(resolved)
    if problem:
        raise ConfigError(f"runner.device: {problem} (got {str(device)!r}); use auto or cpu")
    return resolved


def device_feature_errors(
    amp: str | None, sync_bn: bool, strategy: str, device: torch.device
) -> list[str]:
    """Settings the run's device cannot serve, whatever the task: the Runner refuses them
    and ``config validate`` reports them, with these lines."""
    errors = []
    if amp == "fp16" and device.type != "cuda":
        errors.append("runner.amp: 'fp16' needs a CUDA device; use 'bf16' on CPU")
    elif amp == "fp16" and strategy == "fsdp":
        errors.append("runner.amp: 'fp16' is not supported with strategy fsdp; use 'bf16'")
    if sync_bn and device.type != "cuda":
        errors.append(f"runner.sync_bn: SyncBatchNorm needs CUDA (device is {device})")
    return errors


def _missing(device: torch.device) -> str | None:
    """Why ``device`` cannot hold this run, or None."""
    if device.type == "meta":
        return "'meta' tensors hold no data, nothing can train on them"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available here"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"there {'is' if count == 1 else 'are'} only {count} CUDA device(s)"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available here"
    return None

"""The Runner's plain arguments, checked together so every mistake is reported at once."""

from __future__ import annotations

import torch

from hookrun.errors import ConfigError


def resolve_device(device: str | torch.device, local_rank: int) -> torch.device:
    if str(device) == "auto":
        return (
            torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        )
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"runner.device: {exc}") from None


def check_arguments(
    max_epochs: int | None,
    max_iters: int | None,
    val_interval: int,
    amp: str | None,
    grad_accum: int,
    scheduler_interval: str,
) -> None:
    errors = []
    if max_epochs is not None and max_iters is not None:
        errors.append("runner: give max_epochs or max_iters, not both")
    for name, value in (("max_epochs", max_epochs), ("max_iters", max_iters)):
        if value is not None and (not isinstance(value, int) or value < 1):
            errors.append(f"runner.{name}: must be an int >= 1 (got {value!r})")
    if not isinstance(val_interval, int) or val_interval < 1:
        errors.append(f"runner.val_interval: must be an int >= 1 (got {val_interval!r})")
    if amp not in (None, "bf16", "fp16"):
        errors.append(f"runner.amp: must be null, 'bf16' or 'fp16' (got {amp!r})")
    if not isinstance(grad_accum, int) or grad_accum < 1:
        errors.append(f"runner.grad_accum: must be an int >= 1 (got {grad_accum!r})")
    if scheduler_interval not in ("epoch", "iter"):
        errors.append(
            f"runner.scheduler_interval: must be 'epoch' or 'iter' (got {scheduler_interval!r})"
        )
    if errors:
        raise ConfigError(errors)

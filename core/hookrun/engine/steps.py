"""The two model conventions: how a batch becomes losses (training) or metric values (evaluation).

1. The model defines ``training_step(batch)`` returning a loss tensor or a dict holding
   ``"loss"``, and ``validation_step(batch)`` returning a dict of per-batch metric values.
2. A plain ``nn.Module`` called on ``inputs`` of an ``(inputs, targets)`` batch, with
   ``criterion(outputs, targets)`` and ``metrics={"name": fn(outputs, targets)}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hookrun.distributed.collectives import all_reduce_sum
from hookrun.errors import ConfigError


def check_convention(model: nn.Module, criterion: Any) -> None:
    """Refuse a model that neither defines ``training_step`` nor comes with a criterion."""
    if not callable(getattr(model, "training_step", None)) and criterion is None:
        raise ConfigError(
            f"model: {type(model).__name__} defines no training_step(batch); "
            "pass criterion=... (and metrics=...) or define training_step"
        )


def training_losses(
    model: nn.Module,
    module: nn.Module,
    step: Callable[..., Any] | None,
    criterion: Any,
    batch: Any,
) -> dict[str, torch.Tensor]:
    """Losses of one batch as a dict with ``"loss"`` first.

    ``model`` may be a DDP wrapper of ``module``; ``step`` is the module's ``training_step``
    (or None), called through the wrapper so DDP's gradient hooks fire.
    """
    if step is not None:
        out = step(batch) if model is module else _through_wrapper(model, module, step, batch)
    else:
        inputs, targets = batch[0], batch[1]
        out = criterion(model(inputs), targets)
    if isinstance(out, torch.Tensor):
        return {"loss": out}
    if not isinstance(out, Mapping) or "loss" not in out:
        raise TypeError(
            f"{type(module).__name__}.training_step must return a loss tensor or a dict "
            f"with 'loss' (got {type(out).__name__})"
        )
    return {"loss": out["loss"], **{k: v for k, v in out.items() if k != "loss"}}


def _through_wrapper(
    model: nn.Module, module: nn.Module, step: Callable[..., Any], batch: Any
) -> Any:
    """Run ``training_step`` so DDP sees a forward: temporarily route forward to the step."""
    original = module.forward
    module.forward = step
    try:
        return model(batch)
    finally:
        module.forward = original


def evaluation_values(
    module: nn.Module,
    criterion: Any,
    metrics: Mapping[str, Callable[..., Any]],
    batch: Any,
    mode: str,
) -> dict[str, Any]:
    """Per-batch metric values (means over the batch) for validation or test."""
    step = getattr(module, f"{mode}_step", None) if mode == "test" else None
    step = step or getattr(module, "validation_step", None)
    if step is not None:
        values = step(batch)
        if not isinstance(values, Mapping):
            raise TypeError(
                f"{type(module).__name__}.{step.__name__} must return a dict of metric values "
                f"(got {type(values).__name__})"
            )
        return dict(values)
    inputs, targets = batch[0], batch[1]
    outputs = module(inputs)
    values = {"loss": criterion(outputs, targets)} if criterion is not None else {}
    for name, fn in metrics.items():
        values[name] = fn(outputs, targets)
    return values


class MetricMeans:
    """Sample-weighted sums of per-batch metric values, kept on the device until the end of
    the pass, then reduced over ranks and read to the host in one transfer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, values: Mapping[str, Any], n: int) -> None:
        for name, value in values.items():
            value = torch.as_tensor(value, device=self.device).detach().double().mean() * n
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.count += n

    def result(self) -> dict[str, float]:
        names = list(self.sums)
        packed = all_reduce_sum(torch.stack([*(self.sums[n] for n in names), self.count]))
        values = packed.tolist()
        total = values[-1] or 1.0
        return {name: value / total for name, value in zip(names, values[:-1], strict=True)}


def batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    return 1


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, Mapping):
        return type(batch)((k, to_device(v, device)) for k, v in batch.items())  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch

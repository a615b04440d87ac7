"""Batches as the loops handle them: how many samples one holds (for rates and means), and
one moved to the run's device, whatever its nesting (tensors, mappings, sequences, named
tuples, dataclasses, objects with ``.to``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch


def batch_size(batch: Any) -> int:
    """Samples in a batch: the length of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return batch_size(getattr(batch, dataclasses.fields(batch)[0].name))
    return 1


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device``: tensors, mappings, sequences,
    named tuples, dataclasses and any object with a ``.to(device)`` method."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, MutableMapping):  # a copy keeps its kind: a defaultdict its factory
        moved = copy.copy(batch)
        moved.update((k, to_device(v, device)) for k, v in batch.items())
        return moved
    if isinstance(batch, Mapping):
        values = {k: to_device(v, device) for k, v in batch.items()}
        try:
            return type(batch)(values)  # type: ignore[call-arg]
        except TypeError:  # a read-only mapping its class cannot build from a dict: a dict
            return values
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {
            f.name: to_device(getattr(batch, f.name), device)
            for f in dataclasses.fields(batch)
            if f.init
        }
        return dataclasses.replace(batch, **fields)
    if callable(getattr(batch, "to", None)):
        return batch.to(device)
    return batch

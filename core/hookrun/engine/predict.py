"""Prediction: the model's outputs over a loader, in the loader's order, each sample once.

One pass in eval mode, without gradients, under the run's autocast, with the
``*_predict*`` hook points. Nothing is averaged into metrics or written to the writers:
the outputs are returned. How they are put together (docs/predict.md):

- each batch's output is moved to the CPU; mappings become dicts and named tuples tuples,
  so the whole can be saved and loaded with ``torch.load(weights_only=True)``;
- tensors with a batch dimension are concatenated along dim 0, lists (one entry a sample)
  joined, dicts and tuples of them put together field by field;
- anything else (a number, a 0-d tensor, tensors whose shapes differ between batches) is a
  list with one entry a batch.

Under torch.distributed each rank predicts one contiguous block of the loader's order
(:func:`hookrun.data.sharding.predict_sampler`, no padding) and every rank gets all the
outputs, gathered in rank order: the loader's order, each sample once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookrun.data.batches import to_device
from hookrun.data.loaders import make_loader
from hookrun.data.sharding import predict_sampler
from hookrun.distributed import fsdp, process_group
from hookrun.distributed.collectives import all_gather_object
from hookrun.engine.steps import convention_call, kind

CPU = torch.device("cpu")


def predict(runner: Any, dataloader: Any) -> Any:
    """The outputs of ``runner``'s model over ``dataloader`` (see the module), with the
    hook points ``before_predict``, ``before_predict_iter``/``after_predict_iter`` and
    ``after_predict``; the model's training mode and the runner's mode are restored."""
    sampler = predict_sampler(dataloader, "dataloader", runner.seed, runner.rank, runner.world_size)
    loader = make_loader(dataloader, runner.seed, sampler, runner.stop_signals.numbers)
    model, hooks = runner.unwrapped_model, runner.hooks
    was_training, previous = model.training, runner.mode
    model.eval()
    runner.mode = "predict"
    try:
        hooks.before_predict(runner=runner)
        process_group.broadcast_buffers(model)  # every rank predicts with rank 0's buffers
        outputs = _pass(runner, loader)
        if runner.world_size > 1:
            outputs = [part for part in all_gather_object(outputs) if part]
        else:
            outputs = [outputs] if outputs else []
        result = combine([part for rank_outputs in outputs for part in rank_outputs])
        hooks.after_predict(runner=runner, outputs=result)
    finally:
        model.train(was_training)
        runner.mode = previous
        if loader is not None:
            loader.close()
    return result


def _pass(runner: Any, loader: Any) -> list[Any]:
    """This rank's outputs, one entry a batch, on the CPU."""
    hooks, model, device = runner.hooks, runner.unwrapped_model, runner.device
    transform = hooks.transform_batch if hooks.transform_batch.used else None
    step = getattr(model, "predict_step", None)
    batches = loader.epoch_iter(0)
    if runner.strategy == "fsdp":  # every rank runs as many forwards as the busiest one
        pairs = fsdp.lockstep(batches, len(loader))
    else:
        pairs = ((batch, True) for batch in batches)
    outputs: list[Any] = []
    with torch.no_grad():
        for batch_idx, (batch, counted) in enumerate(pairs):
            batch = to_device(batch, device)
            if transform is not None:
                batch = transform(runner=runner, batch=batch, mode="predict")
            if counted:
                hooks.before_predict_iter(runner=runner, batch_idx=batch_idx, batch=batch)
            with runner.autocast():
                out = step(batch) if step is not None else forward(model, runner.criterion, batch)
            if not counted:
                continue
            out = to_cpu(out)
            outputs.append(out)
            hooks.after_predict_iter(runner=runner, batch_idx=batch_idx, batch=batch, outputs=out)
    return outputs


def forward(model: nn.Module, criterion: Any, batch: Any) -> Any:
    """The forward as the step conventions call it (:mod:`hookrun.engine.steps`): under a
    ``criterion`` the inputs of an ``(inputs, targets)`` batch (a one-element one too),
    else ``model(**batch)`` for a mapping batch and ``model(batch)`` for any other."""
    if criterion is not None and isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
        convention = "the inputs of an (inputs, targets) batch"
    else:
        convention = "model(**batch) for a mapping batch, else model(batch)"
    mapping = isinstance(batch, Mapping)
    return convention_call(
        model,
        () if mapping else (batch,),
        lambda: f"{type(model).__name__} cannot take {kind(batch)} to predict ({convention})",
        "define predict_step(batch) on the model",
        batch if mapping else None,
    )


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor on the CPU, mappings as dicts, named tuples as tuples."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(CPU)
    if isinstance(value, Mapping):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(to_cpu(item) for item in value)
    if isinstance(value, list):
        return [to_cpu(item) for item in value]
    return value


def combine(parts: list[Any]) -> Any:
    """Per-batch outputs put together (see the module); ``[]`` for no batch at all."""
    if not parts:
        return []
    first = parts[0]
    if all(isinstance(p, torch.Tensor) and p.dim() > 0 for p in parts):
        if all(p.shape[1:] == first.shape[1:] and p.dtype == first.dtype for p in parts):
            return torch.cat(parts)
    elif all(isinstance(p, list) for p in parts):
        return [item for part in parts for item in part]
    elif all(isinstance(p, dict) and p.keys() == first.keys() for p in parts):
        return {key: combine([p[key] for p in parts]) for key in first}
    elif all(isinstance(p, tuple) and len(p) == len(first) for p in parts):
        return tuple(combine([p[i] for p in parts]) for i in range(len(first)))
    return list(parts)

"""Evaluation: one pass over a loader in eval mode, metrics averaged over every sample of
every rank, with the ``*_{mode}*`` hook points (validation inside training, ``val()``,
``test()``) or without them (``runner.evaluate`` for plugins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hookrun.distributed import fsdp, process_group
from hookrun.engine.steps import MetricMeans, batch_size, evaluation_values, to_device


def evaluate(runner: Any, loader: Any, mode: str, hooks: bool) -> dict[str, float]:
    """:func:`evaluate_or_stop` that no stop signal can cut short."""
    metrics = evaluate_or_stop(runner, loader, mode, hooks, done=None, stoppable=False)
    assert metrics is not None
    return metrics


def evaluate_or_stop(
    runner: Any,
    loader: Any,
    mode: str,
    hooks: bool,
    done: Callable[[], None] | None,
    stoppable: bool,
) -> dict[str, float] | None:
    """One pass over ``loader`` in eval mode, metrics averaged over every sample of every
    rank. With ``hooks`` the ``*_{mode}*`` hook points fire, all of them in eval mode, and
    the metrics go to the writers; the training mode is restored afterwards. ``done`` is
    called once the pass is complete, before ``after_{mode}_epoch``.

    A stop signal agreed during a ``stoppable`` pass ends it at a batch boundary: then
    ``after_{mode}_epoch`` does not fire, ``after_{mode}`` does, and the result is None."""
    points = runner.hooks if hooks else None
    model = runner.unwrapped_model
    was_training = model.training
    model.eval()
    try:
        if points is not None:
            getattr(points, f"before_{mode}")(runner=runner)
            getattr(points, f"before_{mode}_epoch")(runner=runner)
        process_group.broadcast_buffers(model)  # the weights evaluated, an EMA's swapped in too
        metrics = _pass(runner, loader, mode, points, stoppable=stoppable)
        if metrics is not None and done is not None:
            done()
        if points is not None:
            if metrics is not None:
                getattr(points, f"after_{mode}_epoch")(runner=runner, metrics=metrics)
                runner.last_metrics[mode] = dict(metrics)
                runner.write_scalars({f"{mode}/{k}": v for k, v in metrics.items()})
            getattr(points, f"after_{mode}")(runner=runner)
    finally:
        model.train(was_training)
    return metrics


def _pass(
    runner: Any, loader: Any, mode: str, points: Any, stoppable: bool
) -> dict[str, float] | None:
    """The metrics, or None when a stop signal ended a ``stoppable`` pass (the training
    loop's validation; under torch.distributed it is only agreed between iterations)."""
    stop = runner.stop_signals if stoppable else None
    transform = runner.hooks.transform_batch if runner.hooks.transform_batch.used else None
    before_iter = getattr(points, f"before_{mode}_iter", None)
    after_iter = getattr(points, f"after_{mode}_iter", None)
    means = MetricMeans(runner.device)
    model, device = runner.unwrapped_model, runner.device
    batches = loader.epoch_iter(0)
    if runner.strategy == "fsdp":  # every rank runs as many forwards as the busiest one
        pairs = fsdp.lockstep(batches, len(loader))
    else:
        pairs = ((batch, True) for batch in batches)
    with torch.no_grad():
        for batch_idx, (batch, counted) in enumerate(pairs):
            if stop is not None and stop.agreed is not None:
                return None
            batch = to_device(batch, device)
            if transform is not None:
                batch = transform(runner=runner, batch=batch, mode=mode)
            if not counted:
                with runner.autocast():
                    evaluation_values(model, runner.criterion, runner.metrics, batch, mode)
                continue
            if before_iter is not None:
                before_iter(runner=runner, batch_idx=batch_idx, batch=batch)
            with runner.autocast():
                values = evaluation_values(model, runner.criterion, runner.metrics, batch, mode)
            means.add(values, batch_size(batch))
            if after_iter is not None:
                after_iter(runner=runner, batch_idx=batch_idx, batch=batch, outputs=values)
    return means.result()

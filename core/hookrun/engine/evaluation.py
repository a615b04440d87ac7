"""Evaluation: one pass over a loader in eval mode, metrics averaged over every sample of
every rank, with the ``*_{mode}*`` hook points (validation inside training, ``val()``,
``test()``) or without them (``runner.evaluate`` for plugins).

Several named sets (a mapping of names to loaders) are one validation: the hook points fire
once around all of them, each set's pass in the mapping's order, and the metrics are
``<name>/<metric>`` (written as ``val/<name>/<metric>``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hookrun.data.batches import batch_size, to_device
from hookrun.data.limits import limited
from hookrun.data.loaders import make_loader
from hookrun.data.sharding import eval_sampler
from hookrun.distributed import fsdp, process_group
from hookrun.engine.reporting import metrics_line, write_line
from hookrun.engine.steps import MetricMeans, evaluation_values
from hookrun.errors import ConfigError


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
        metrics = _sets_pass(runner, loader, mode, points, stoppable=stoppable)
        if metrics is not None and done is not None:
            done()
        if points is not None:
            if metrics is not None:
                if runner.reporter.prints and runner.is_main:  # no plugin renders the console
                    write_line(runner.console, metrics_line(runner, mode, metrics))
                getattr(points, f"after_{mode}_epoch")(runner=runner, metrics=metrics)
                runner.last_metrics[mode] = dict(metrics)
                runner.write_scalars({f"{mode}/{k}": v for k, v in metrics.items()})
            getattr(points, f"after_{mode}")(runner=runner)
    finally:
        model.train(was_training)
    return metrics


def evaluation_loaders(loader: Any, name: str, runner: Any) -> Any:
    """An evaluation loader as the passes use it (this rank's share, ``limit_val_batches``),
    or a dict of them by name for a mapping of named sets."""
    if not isinstance(loader, Mapping):
        return _evaluation_loader(loader, name, runner)
    if not loader or not all(isinstance(key, str) and key for key in loader):
        raise ConfigError(
            f"{name}: a mapping of validation sets needs at least one set, each named by a "
            f"non-empty string (got {list(loader)!r})"
        )
    return {
        key: _evaluation_loader(value, f"{name}[{key!r}]", runner) for key, value in loader.items()
    }


def _evaluation_loader(loader: Any, name: str, runner: Any) -> Any:
    sampler = eval_sampler(loader, name, runner.seed, runner.rank, runner.world_size)
    wrapped = make_loader(loader, runner.seed, sampler, runner.stop_signals.numbers)
    return limited(wrapped, runner.limits[1])


def _sets_pass(
    runner: Any, loaders: Any, mode: str, points: Any, stoppable: bool
) -> dict[str, float] | None:
    """:func:`_pass` over one loader, or over each named set with ``<name>/`` before its
    metrics; None when a stop signal ended a pass."""
    if not isinstance(loaders, dict):
        return _pass(runner, loaders, mode, points, stoppable)
    metrics: dict[str, float] = {}
    for name, loader in loaders.items():
        found = _pass(runner, loader, mode, points, stoppable)
        if found is None:
            return None
        metrics.update({f"{name}/{key}": value for key, value in found.items()})
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

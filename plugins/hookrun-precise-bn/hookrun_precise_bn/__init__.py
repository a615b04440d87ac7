"""Precise BatchNorm: replace running statistics by the exact population statistics.

BatchNorm's running mean and variance are an exponential average of per-batch statistics
taken while the weights were still moving, so they lag the weights being evaluated. Before
validation this plugin runs ``num_batches`` training batches through the model and sets every
BatchNorm layer's ``running_mean`` / ``running_var`` to the mean and unbiased variance of that
layer's inputs over all those samples: per-batch (count, mean, M2) in float64, merged with
Chan's formula and summed across ranks, so unequal batch sizes and large means stay exact.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, IterableDataset

from hookrun import (
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    all_reduce_sum,
    hookimpl,
    is_distributed,
    loader_options,
    mix_seed,
    swap_stack,
)


class PreciseBNSettings(PluginSettings):
    num_batches: int = Field(
        200,
        ge=1,
        description="Training batches per recomputation on each rank; capped at one pass over "
        "the training data.",
    )
    interval: int = Field(
        1, ge=1, description="Recompute every `interval` epochs (by_epoch) or iterations."
    )
    by_epoch: bool = Field(
        True,
        description="true: after every `interval`-th epoch; false: after every `interval`-th "
        "iteration. The last epoch or iteration of training always recomputes.",
    )
    models: Literal["model", "all"] = Field(
        "model",
        description="`model`: the trained model; `all`: also every extra model other plugins "
        "expose through the `extra_models` hook point (an EMA copy, for instance).",
    )


class PreciseBN(Plugin[PreciseBNSettings]):
    """Recomputes BatchNorm statistics after training epochs or iterations, before validation
    and checkpointing (priority ABOVE_NORMAL runs it before EMA, logger and checkpoint)."""

    name = "precise_bn"
    Settings = PreciseBNSettings
    priority = Priority.ABOVE_NORMAL
    enabled_by_default = False

    def __init__(self, settings: PreciseBNSettings | None = None) -> None:
        super().__init__(settings)
        self._told: set[str] = set()

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        every = self.settings.interval
        if not self.settings.by_epoch and (runner.every_n_iters(every) or runner.is_last_iter()):
            self.recompute(runner)

    @hookimpl
    def after_train_epoch(self, runner: RunnerProtocol) -> None:
        every = self.settings.interval
        if self.settings.by_epoch and (runner.every_n_epochs(every) or runner.is_last_epoch()):
            self.recompute(runner)

    def recompute(self, runner: RunnerProtocol) -> None:
        """One pass per model, each seeing the same batches; every RNG is restored after, so
        the training run is the same with or without this plugin. The trained model's pass
        runs on the trained weights even while other plugins have averages swapped in (they
        are swapped out for it and back in after); each extra model's factory swaps it in on
        top of the model's swap stack, and out again in reverse order."""
        models: dict[str, Callable[[], Any]] = {"model": swap_stack(runner.unwrapped_model).exposed}
        if self.settings.models == "all":
            models.update(runner.extra_models())
        rng = runner.rng_state()
        try:
            for name, swapped_in in models.items():
                runner.set_rng_state(rng)
                with swapped_in():
                    self._recompute_model(runner, name)
        finally:
            runner.set_rng_state(rng)

    def _recompute_model(self, runner: RunnerProtocol, name: str) -> None:
        model = runner.unwrapped_model
        layers, frozen = bn_layers(model)
        if frozen:
            self._notice(
                runner,
                f"precise_bn: {frozen} BatchNorm layer(s) of {name!r} are in eval mode (frozen); "
                "their statistics are kept",
            )
        if not layers:
            self._notice(
                runner,
                f"precise_bn: {name!r} has no BatchNorm layer with running statistics in train "
                "mode; nothing to recompute",
            )
            return
        seed = mix_seed(runner.seed, runner.iter, 0x9B)
        batches = training_batches(
            runner.train_dataloader,
            self.settings.num_batches,
            seed,
            runner.rank,
            runner.world_size,
        )
        with runner.autocast():
            done = recompute_bn_stats(
                model, layers, batches, lambda batch: model_forward(model, runner.to_device(batch))
            )
        self._notice(
            runner,
            f"precise_bn: recomputed {len(layers)} BatchNorm layer(s) of {name!r} "
            f"over {done} batch(es) per rank",
        )

    def _notice(self, runner: RunnerProtocol, message: str) -> None:
        """Each message once per plugin instance, so periodic passes do not flood the console."""
        if message not in self._told:
            self._told.add(message)
            runner.info(message)


def bn_layers(model: nn.Module) -> tuple[list[_BatchNorm], int]:
    """BatchNorm layers to recompute, and the number of eval-mode ones left alone.

    Layers without running statistics have nothing to recompute. Layers in eval mode during
    training are frozen on purpose (fine-tuning with pretrained statistics): their running
    statistics take part in every training forward, so changing them would change training.
    """
    layers, frozen = [], 0
    for module in model.modules():
        if isinstance(module, _BatchNorm) and module.running_mean is not None:
            if module.training:
                layers.append(module)
            else:
                frozen += 1
    return layers, frozen


def model_forward(module: nn.Module, batch: Any) -> None:
    """Run one batch the way the model trains: ``precise_bn_forward(batch)`` when the model
    defines it (a cheaper forward without the loss), else ``training_step(batch)``, else
    ``module(inputs)`` for an ``(inputs, targets)`` batch."""
    for name in ("precise_bn_forward", "training_step"):
        step = getattr(module, name, None)
        if callable(step):
            step(batch)
            return
    module(batch[0])


def training_batches(
    loader: Any, num_batches: int, seed: int, rank: int = 0, world_size: int = 1
) -> Iterator[Any]:
    """Up to ``num_batches`` training batches from a loader of our own, never the runner's.

    A map-style ``DataLoader`` gets a fresh shuffled order from ``seed`` (the same on every
    rank, each rank taking its own equal share, at most one pass over the data) and keeps its
    batch size, ``drop_last``, ``collate_fn`` and workers. Other loaders are copied with
    their samplers; a plain re-iterable of batches is iterated afresh.
    """
    if not isinstance(loader, DataLoader):
        if loader is None or iter(loader) is loader:
            raise ConfigError(
                "plugins.precise_bn: needs a train_dataloader it can iterate again "
                f"(a DataLoader or a list of batches), got {type(loader).__name__}"
            )
        return itertools.islice(iter(loader), num_batches)
    options = {**loader_options(loader), "generator": torch.Generator().manual_seed(seed)}
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        own = DataLoader(
            dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, **options
        )
    elif loader.batch_size is None:
        sampling = (
            {"batch_sampler": copy.deepcopy(loader.batch_sampler)}
            if loader.batch_sampler is not None
            else {"batch_size": None, "sampler": copy.deepcopy(loader.sampler)}
        )
        own = DataLoader(dataset, **sampling, **options)
    else:
        size = len(dataset)  # type: ignore[arg-type]
        batches = shuffled_batches(
            size, loader.batch_size, loader.drop_last, seed, rank, world_size
        )
        own = DataLoader(dataset, batch_sampler=batches[:num_batches], **options)
    return itertools.islice(iter(own), num_batches)


def shuffled_batches(
    size: int, batch_size: int, drop_last: bool, seed: int, rank: int, world_size: int
) -> list[list[int]]:
    """Index batches of one shuffled pass; rank ``r`` of ``w`` takes every ``w``-th index of an
    order cut to a multiple of ``w``, so every rank runs the same number of batches."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    share = order[rank : size - size % world_size : world_size].tolist()
    batches = [share[i : i + batch_size] for i in range(0, len(share), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


class Moments:
    """Sums of one layer's inputs, batch by batch, each batch centred on its own mean.

    Centring on the batch's mean (two passes over the batch) keeps the summed squares of the
    size of the batch's spread whatever the mean and whatever any one sample is, so float32
    sums lose nothing and need no float64 copy of the batch (which made the pass 1.4-4.9x
    slower). Each batch's (count, mean, M2) is then formed and merged in float64 with
    Chan's formula, exact with unequal batch sizes. Nothing here reads a value back to the host.
    """

    def __init__(self) -> None:
        self.batches: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Record a batch ``(N, C, *)`` (statistics over every dim but 1). Returns the batch
        centred on its mean, the per-channel sum and sum of squares of the centred values,
        and a spare tensor of the batch's shape (the squares, no longer needed), from which a
        BatchNorm normalises without reducing the batch again or allocating another one."""
        work = x.detach()
        if work.dtype not in (torch.float32, torch.float64):
            work = work.float()
        dims = [0, *range(2, work.dim())]
        centre = work.mean(dims)
        centred = work - _per_channel(centre, work.dim())
        spare = centred.square()
        s1, s2 = centred.sum(dims), spare.sum(dims)  # s1: the rounding left in ``centre``
        self.batches.append((work.numel() // work.shape[1], centre, s1, s2))
        return centred, s1, s2, spare

    def result(self, like: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(count, mean, M2) over every batch, in float64 on ``like``'s device."""
        zeros = torch.zeros(like.shape, dtype=torch.float64, device=like.device)
        if not self.batches:
            return 0, zeros, zeros.clone()
        device = self.batches[0][1].device
        sizes = [n for n, _, _, _ in self.batches]
        counts = torch.tensor(sizes, dtype=torch.float64, device=device).unsqueeze(1)
        centres = torch.stack([c for _, c, _, _ in self.batches]).double()
        s1 = torch.stack([s for _, _, s, _ in self.batches]).double()
        s2 = torch.stack([s for _, _, _, s in self.batches]).double()
        batch_means = centres + s1 / counts
        batch_m2 = s2 - s1.square() / counts  # s1 is rounding-sized: no cancellation
        total = sum(sizes)
        mean = (counts * batch_means).sum(0) / total
        m2 = batch_m2.sum(0) + (counts * (batch_means - mean).square()).sum(0)
        return total, mean, m2

    def hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        """Forward pre-hook for BatchNorm variants with their own forward (SyncBatchNorm)."""
        if args[0].numel():
            self.add(args[0])

    def forward_for(self, bn: _BatchNorm) -> Callable[[torch.Tensor], torch.Tensor]:
        """A train-mode forward for a plain BatchNorm that normalises with the sums
        :meth:`add` computed, so each batch is reduced once, not by BatchNorm and again here."""

        def forward(x: torch.Tensor) -> torch.Tensor:
            bn._check_input_dim(x)
            if x.numel() == 0:
                return _BatchNorm.forward(bn, x)
            centred, s1, s2, spare = self.add(x)
            n = x.numel() // x.shape[1]
            offset = s1 / n
            var = (s2 / n).sub_(offset.square()).clamp_(min=0)  # biased, as train mode uses
            scale = var.add_(bn.eps).rsqrt_()
            if bn.weight is not None:
                scale = scale * bn.weight
            shift = (offset * scale).neg_()
            if bn.bias is not None:
                shift = shift + bn.bias
            dim = x.dim()
            out = torch.addcmul(
                _per_channel(shift, dim), centred, _per_channel(scale, dim), out=spare
            )
            return out.to(x.dtype)

        return forward


def _per_channel(values: torch.Tensor, dim: int) -> torch.Tensor:
    return values.view(1, -1, *([1] * (dim - 2)))


Stats = tuple[int, torch.Tensor, torch.Tensor]


def reduce_moments(stats: list[Stats]) -> list[Stats]:
    """Every rank's (count, mean, M2) per layer turned into those of the union of all ranks.

    Two float64 sums: counts and count·mean give the global mean; then each rank's
    M2 + count·(mean − global mean)² sums to the global M2 (Chan's merge, no E[x²] − E[x]²
    cancellation), equal to one process over the union up to float64 rounding.
    """
    if not stats or not is_distributed():
        return stats
    device = stats[0][1].device
    counts = torch.tensor([c for c, _, _ in stats], dtype=torch.float64, device=device)
    sums = all_reduce_sum(torch.cat([counts, *(mean * c for c, mean, _ in stats)]))
    totals = [int(t) for t in sums[: len(stats)].tolist()]
    sizes = [mean.numel() for _, mean, _ in stats]
    means = [
        s / max(total, 1)
        for s, total in zip(torch.split(sums[len(stats) :], sizes), totals, strict=True)
    ]
    spread = torch.cat(
        [m2 + c * (mean - g).square() for (c, mean, m2), g in zip(stats, means, strict=True)]
    )
    m2s = torch.split(all_reduce_sum(spread), sizes)
    return list(zip(totals, means, m2s, strict=True))


def recompute_bn_stats(
    model: nn.Module,
    layers: list[_BatchNorm],
    batches: Iterable[Any],
    forward: Callable[[Any], Any],
) -> int:
    """Set ``running_mean`` / ``running_var`` of ``layers`` to the mean and unbiased variance
    of their inputs over ``batches``; returns the number of batches run on this rank.

    Only ``layers`` are in train mode during the pass (dropout and other layers in eval mode)
    and normalise with their batch statistics; gradients are off, and every module's training
    flag is restored after. Buffers are written in place; ``num_batches_tracked`` keeps its
    value (it counts training batches). A layer that saw fewer than two values keeps its
    statistics.
    """
    flags = [(module, module.training) for module in model.modules()]
    saved = [(bn, [b.clone() for b in _stat_buffers(bn)]) for bn in layers]
    moments = [Moments() for _ in layers]
    handles, replaced = [], []
    for bn, m in zip(layers, moments, strict=True):
        if type(bn).forward is _BatchNorm.forward and "forward" not in vars(bn):
            bn.forward = m.forward_for(bn)  # type: ignore[method-assign,assignment]
            replaced.append(bn)
        else:
            handles.append(bn.register_forward_pre_hook(m.hook))
    done = 0
    try:
        model.eval()
        for bn in layers:
            bn.train()
        with torch.no_grad():
            for batch in batches:
                forward(batch)
                done += 1
    finally:
        for handle in handles:
            handle.remove()
        for bn in replaced:
            del bn.forward
        for module, flag in flags:
            module.training = flag
        for bn, buffers in saved:
            for buffer, value in zip(_stat_buffers(bn), buffers, strict=True):
                buffer.copy_(value)
    results = [m.result(bn.running_mean) for bn, m in zip(layers, moments, strict=True)]  # type: ignore[arg-type]
    for bn, (count, mean, m2) in zip(layers, reduce_moments(results), strict=True):
        if count > 1:
            bn.running_mean.copy_(mean)  # type: ignore[union-attr]
            bn.running_var.copy_(m2 / (count - 1))  # type: ignore[union-attr]
    return done


def _stat_buffers(bn: _BatchNorm) -> list[torch.Tensor]:
    """The buffers a train-mode forward may change (SyncBatchNorm's own forward does)."""
    names = ("running_mean", "running_var", "num_batches_tracked")
    return [b for b in (getattr(bn, name) for name in names) if b is not None]

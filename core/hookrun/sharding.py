"""Each rank's share of a loader's samples under torch.distributed, the loader's own sampler kept.

Every epoch the loader's sampler (a ``RandomSampler``, ``SubsetRandomSampler``,
``WeightedRandomSampler``, any ``Sampler``) is seeded from (seed, epoch) as in a single
process and its indices are dealt out in turn: rank ``r`` of ``W`` takes positions ``r``,
``r + W``, ... So after ``k`` batches of ``B`` on every rank the job has used exactly the
first ``k * B * W`` indices of the epoch's order, whatever ``W`` is: a run resumed on another
number of ranks continues from that global position (:meth:`ShardedSampler.continue_epoch`).

Training pads the order to a multiple of ``W`` with its first indices (every rank needs as
many batches, as with ``DistributedSampler``); evaluation does not pad, so each sample counts
once and metrics are not biased.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from hookrun.data import seed_epoch
from hookrun.errors import ConfigError

SHARDED_FLAG = "hookrun_already_sharded"


def already_sharded(loader: Any) -> Any:
    """Declare that ``loader`` already yields this rank's share (an ``IterableDataset`` that
    splits by ``torch.distributed.get_rank()``, a custom ``batch_sampler``): hookrun then
    uses it as it is under torch.distributed instead of refusing it. Returns ``loader``, or
    for an object that takes no attribute (a list of batches) a re-iterable view of it."""
    try:
        setattr(loader, SHARDED_FLAG, True)
    except AttributeError:
        return _Declared(loader)
    return loader


class _Declared:
    """A re-iterable that cannot carry the mark of :func:`already_sharded` itself."""

    hookrun_already_sharded = True

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable)

    def __len__(self) -> int:
        return len(self.iterable)


class ShardedSampler(Sampler[int]):
    """This rank's share of ``sampler``'s indices, epoch by epoch (see the module)."""

    def __init__(self, sampler: Sampler[int], seed: int, rank: int, world: int, pad: bool) -> None:
        self.sampler = sampler
        self.seed = seed
        self.rank = rank
        self.world = world
        self.pad = pad
        self.epoch = 0
        self.resumed: tuple[int, int, int] | None = None  # (epoch, indices used, fillers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        total = len(self.sampler)  # type: ignore[arg-type]
        return (
            math.ceil(total / self.world) if self.pad else len(range(self.rank, total, self.world))
        )

    def __iter__(self) -> Iterator[int]:
        seed_epoch(self.sampler, self.seed, self.epoch)
        order = list(iter(self.sampler))
        fillers: list[int] = []
        if self.resumed is not None and self.resumed[0] == self.epoch:
            _, used, count = self.resumed
            fillers = order[:1] * count  # skipped by the loader, never fetched
            order = order[used:]
        if self.pad and order and len(order) % self.world:
            extra = self.world - len(order) % self.world
            order += (order * math.ceil(extra / len(order)))[:extra]
        return iter(fillers + order[self.rank :: self.world])

    def continue_epoch(self, epoch: int, used: int, batch_size: int, drop_last: bool) -> int:
        """Make ``epoch`` continue after the first ``used`` indices of its order, dealt out
        over this run's ranks; returns the batches of the epoch to count as done (the
        epoch's length stays that of a full epoch on this many ranks)."""
        used = min(used, len(self.sampler))  # type: ignore[arg-type]
        left = math.ceil((len(self.sampler) - used) / self.world)  # type: ignore[arg-type]
        per_epoch, to_go = (
            (len(self) // batch_size, left // batch_size)
            if drop_last
            else (math.ceil(len(self) / batch_size), math.ceil(left / batch_size))
        )
        done = per_epoch - to_go
        self.resumed = (epoch, used, done * batch_size)
        return done


def train_sampler(loader: Any, name: str, seed: int, rank: int, world: int) -> Sampler[int] | None:
    """The sampler a training loader is rebuilt with: its own, sharded (also in a single
    process, so that a run saved on several ranks can continue on one). None when the loader
    keeps its sampling: a ``DistributedSampler`` of the user's, a loader declared
    :func:`already_sharded`, or one hookrun cannot shard in a single process."""
    if not _shardable(loader, name, world):
        return None
    return ShardedSampler(loader.sampler, seed, rank, world, pad=True)


def eval_sampler(loader: Any, name: str, seed: int, rank: int, world: int) -> Sampler[int] | None:
    """An evaluation loader's own sampler, sharded without padding under torch.distributed."""
    if world == 1 or not _shardable(loader, name, world):
        return None
    return ShardedSampler(loader.sampler, seed, rank, world, pad=False)


def _shardable(loader: Any, name: str, world: int) -> bool:
    """Whether hookrun deals out ``loader``'s indices; under torch.distributed a loader it
    cannot shard, not declared :func:`already_sharded`, is a config error naming it."""
    if loader is None or getattr(loader, SHARDED_FLAG, False):
        return False
    if isinstance(loader, DataLoader) and isinstance(loader.sampler, DistributedSampler):
        return False  # the user's own sharding
    why = _unshardable(loader)
    if why is None:
        return True
    if world > 1:
        raise ConfigError(
            f"{name}: {why}, which hookrun cannot split across {world} ranks; give each rank "
            "its share yourself and mark the loader with hookrun.already_sharded(loader)"
        )
    return False


def _unshardable(loader: Any) -> str | None:
    if not isinstance(loader, DataLoader):
        return f"a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return f"a DataLoader over an IterableDataset ({type(loader.dataset).__name__})"
    if loader.batch_sampler is None:
        return "a DataLoader without automatic batching (batch_size=None)"
    if loader.batch_size is None:
        kind = type(loader.batch_sampler).__name__
        return f"a DataLoader with its own batch_sampler ({kind})"
    return None

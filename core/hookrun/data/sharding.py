"""Each rank's share of a loader's samples under torch.distributed, the loader's own sampler kept.

Every epoch the loader's sampler (a ``RandomSampler``, ``SubsetRandomSampler``,
``WeightedRandomSampler``, any ``Sampler``) is seeded from (seed, epoch) as in a single
process and its indices are dealt out in turn: rank ``r`` of ``W`` takes positions ``r``,
``r + W``, ... So after ``k`` batches of ``B`` on every rank the job has used exactly the
first ``k * B * W`` indices of the epoch's order, whatever ``W`` is: a run resumed on another
number of ranks continues from that global position (:meth:`ShardedSampler.continue_epoch`).

Under DDP training does not pad: each sample of an epoch (and of the rest of an epoch resumed
on another number of ranks) is trained exactly once. Every rank runs the epoch as long as
the longest share, rank 0's; a share one sample shorter can end a batch early, and that
rank joins the epoch's last iteration without a batch (:func:`last_batch`; the loop's
:class:`~hookrun.engine.optimizer_step.TailJoin`). FSDP, which has no such join, pads the order to a
multiple of ``W`` with its first indices, as ``DistributedSampler`` does. Evaluation does not
pad, so each sample counts once and metrics are not biased.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

from hookrun.data.loaders import seed_epoch
from hookrun.data.streams import is_stateful
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

    def __init__(
        self, sampler: Sampler[int], seed: int, rank: int, world: int, pad: bool, join: bool = False
    ) -> None:
        self.sampler = sampler
        self.seed = seed
        self.rank = rank
        self.world = world
        self.pad = pad  # repeat the first indices so that every share is as long
        self.join = join  # unpadded, but as long as the longest share (a shorter one joins)
        self.epoch = 0
        self.resumed: tuple[int, int, int] | None = None  # (epoch, indices used, fillers)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        total = len(self.sampler)  # type: ignore[arg-type]
        if self.pad or self.join:
            return math.ceil(total / self.world)
        return len(range(self.rank, total, self.world))

    def batches(self, rank: int, epoch: int, batch_size: int, drop_last: bool) -> int:
        """How many batches rank ``rank``'s unpadded share of ``epoch`` makes (the batches a
        resume counted as done included)."""
        total, used, fillers = len(self.sampler), 0, 0  # type: ignore[arg-type]
        if self.resumed is not None and self.resumed[0] == epoch:
            _, used, fillers = self.resumed
        share = fillers + len(range(rank, total - min(used, total), self.world))
        return share // batch_size if drop_last else math.ceil(share / batch_size)

    def repeated(self, epoch: int) -> int:
        """Indices the padding repeats in ``epoch`` (what is left of it, when resumed)."""
        left = len(self.sampler)  # type: ignore[arg-type]
        if self.resumed is not None and self.resumed[0] == epoch:
            left -= min(self.resumed[1], left)
        return -left % self.world if self.pad and left else 0

    def __iter__(self) -> Iterator[int]:
        seed_epoch(self.sampler, self.seed, self.epoch)
        resumed = self.resumed if self.resumed and self.resumed[0] == self.epoch else None
        if self.world == 1 and resumed is None:  # the whole order as it is: no list of it
            return iter(self.sampler)
        order = list(iter(self.sampler))
        fillers: list[int] = []
        if resumed is not None:
            _, used, count = resumed
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


def train_sampler(
    loader: Any, name: str, seed: int, rank: int, world: int, pad: bool = False
) -> Sampler[int] | None:
    """The sampler a training loader is rebuilt with: its own, sharded (also in a single
    process, so that a run saved on several ranks can continue on one); ``pad`` (FSDP) makes
    the shares even by repeating samples, else a shorter share joins the epoch's last
    iteration. None when the loader keeps its sampling: a ``DistributedSampler`` of the
    user's, a loader declared :func:`already_sharded`, or one hookrun cannot shard in a
    single process; also a loader with its own state (:mod:`hookrun.data.streams`), which
    hookrun does not rebuild: under torch.distributed it must be declared sharded."""
    if is_stateful(loader):
        if world > 1 and not _declared(loader):
            raise ConfigError(
                f"{name}: a {type(loader).__name__}, which resumes by its own state_dict, so "
                f"hookrun does not rebuild it to split it across {world} ranks; give it a "
                "DistributedSampler (map-style) or an IterableDataset that yields this rank's "
                "share, and mark the loader with hookrun.already_sharded(loader)"
            )
        return None
    if not _shardable(loader, name, world):
        return None
    return ShardedSampler(loader.sampler, seed, rank, world, pad=pad, join=not pad)


def eval_sampler(loader: Any, name: str, seed: int, rank: int, world: int) -> Sampler[int] | None:
    """An evaluation loader's own sampler, sharded without padding under torch.distributed."""
    if world == 1 or not _shardable(loader, name, world):
        return None
    return ShardedSampler(loader.sampler, seed, rank, world, pad=False, join=False)


def predict_sampler(
    loader: Any, name: str, seed: int, rank: int, world: int
) -> Sampler[int] | None:
    """A prediction loader's own sampler cut into one contiguous block per rank, without
    padding: rank 0 takes the first share of the order, rank 1 the next, so the ranks'
    outputs put one after the other are in the loader's order, each sample once."""
    if world == 1 or not _shardable(loader, name, world):
        return None
    return BlockSampler(loader.sampler, seed, rank, world)


class BlockSampler(Sampler[int]):
    """Rank ``rank``'s contiguous block of ``sampler``'s order (seeded for epoch 0); the
    first ``len % world`` ranks take one index more."""

    def __init__(self, sampler: Sampler[int], seed: int, rank: int, world: int) -> None:
        self.sampler, self.seed, self.rank, self.world = sampler, seed, rank, world

    def _bounds(self) -> tuple[int, int]:
        share, extra = divmod(len(self.sampler), self.world)  # type: ignore[arg-type]
        start = self.rank * share + min(self.rank, extra)
        return start, start + share + (self.rank < extra)

    def __len__(self) -> int:
        start, end = self._bounds()
        return end - start

    def __iter__(self) -> Iterator[int]:
        seed_epoch(self.sampler, self.seed, 0)
        start, end = self._bounds()
        return itertools.islice(iter(self.sampler), start, end)


def last_batch(loader: Any, epoch: int) -> tuple[bool, bool]:
    """Whether some rank's share of ``epoch`` ends a batch before the epoch's last iteration,
    and whether this rank's does: every rank computes both alike, with no communication.
    (False, False) for a loader whose sampling hookrun does not deal out."""
    sampler = _sharded(loader)
    if sampler is None or not sampler.join or sampler.world == 1:
        return False, False
    batch_sampler = loader.batches.batch_sampler
    size, drop = batch_sampler.batch_size, batch_sampler.drop_last
    longest = sampler.batches(0, epoch, size, drop)
    shortest = sampler.batches(sampler.world - 1, epoch, size, drop)
    if getattr(loader, "limit", longest) <= shortest:  # limit_train_batches: all ranks alike
        return False, False
    return shortest < longest, sampler.batches(sampler.rank, epoch, size, drop) < longest


def padding_note(loader: Any, epoch: int) -> str:
    """The resume line's note on the samples a padded share (FSDP's) repeats in ``epoch``."""
    sampler = _sharded(loader)
    count = sampler.repeated(epoch) if sampler is not None else 0
    if not count:
        return ""
    return f" (FSDP pads the ranks' shares: {count} of them repeated, as DistributedSampler does)"


def _sharded(loader: Any) -> ShardedSampler | None:
    """The :class:`ShardedSampler` a rebuilt loader draws from, if hookrun deals it out."""
    sampler = getattr(
        getattr(getattr(loader, "batches", None), "batch_sampler", None), "sampler", None
    )
    return sampler if isinstance(sampler, ShardedSampler) else None


def _shardable(loader: Any, name: str, world: int) -> bool:
    """Whether hookrun deals out ``loader``'s indices; under torch.distributed a loader it
    cannot shard, not declared :func:`already_sharded`, is a config error naming it."""
    if loader is None or _declared(loader):
        return False
    why = _unshardable(loader)
    if why is None:
        return True
    if world > 1:
        raise ConfigError(
            f"{name}: {why}, which hookrun cannot split across {world} ranks; give each rank "
            "its share yourself and mark the loader with hookrun.already_sharded(loader)"
        )
    return False


def _declared(loader: Any) -> bool:
    """Whether ``loader`` yields this rank's share: declared :func:`already_sharded`, or a
    ``DataLoader`` with a ``DistributedSampler`` of the user's."""
    if getattr(loader, SHARDED_FLAG, False):
        return True
    return isinstance(loader, DataLoader) and isinstance(loader.sampler, DistributedSampler)


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

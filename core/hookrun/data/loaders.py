"""Data loading that can stop and resume at any batch, exactly.

Each epoch's sample order is a function of (seed, epoch) only, and each batch's random
augmentation in a worker process is seeded from (seed, epoch, batch index). A run resumed
at batch ``k`` skips the first ``k`` batches at the index level, so no sample is loaded
twice and the remaining batches equal those of a run never interrupted, for any
``num_workers``. With ``num_workers=0`` augmentation draws from the main process's RNG,
which the checkpoint restores.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import random
import signal
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, get_worker_info

from hookrun.data.streams import PlainLoader, StatefulLoader, is_stateful

_MASK = (1 << 63) - 1

_QUIET_ITERATORS: weakref.WeakSet[Any] = weakref.WeakSet()
"""Live iterators whose worker processes ignore the stop signals."""
_QUIET_WORKERS: weakref.WeakSet[Any] = weakref.WeakSet()
"""Their worker processes, kept past an iterator the garbage collector took: torch's shutdown
from ``__del__`` cannot end a worker that ignores SIGTERM and does not answer in time."""


def end_workers(iterator: Any) -> None:
    """End the workers of a loader iterator whose workers ignore the stop signals: killed,
    not asked to stop. Once its batches are of no use (training ended) nothing is lost, and
    torch's polite shutdown waits up to 10 s for each worker busy in a fetch, then sends the
    SIGTERM they ignore (plain PyTorch's workers die of it at once). Their pids leave torch's
    SIGCHLD check first, so their deaths are not reported as worker failures."""
    from torch.utils.data._utils import signal_handling

    _QUIET_ITERATORS.discard(iterator)
    workers = getattr(iterator, "_workers", ())
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for worker in workers:
        if worker.is_alive():
            worker.kill()
    for worker in workers:
        worker.join()
    iterator._shutdown_workers()  # closes the queues; what the iterator's __del__ calls


@atexit.register
def _end_quiet_workers() -> None:
    """End every such worker still alive before multiprocessing's exit handler sends them
    SIGTERM, which they ignore, and waits for them forever. Registered after torch's own
    exit handlers, so it runs before them."""
    for iterator in list(_QUIET_ITERATORS):
        end_workers(iterator)
    for worker in list(_QUIET_WORKERS):
        if worker.is_alive():
            worker.kill()
            worker.join()


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from integers (splitmix64 steps)."""
    value = 0x9E3779B97F4A7C15
    for part in parts:
        value = (value ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        value = (value ^ (value >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (value ^ (value >> 29)) & _MASK


def seed_all(seed: int) -> None:
    """Seed python, torch and (when loaded) numpy global generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % (1 << 32))


def seed_epoch(sampler: Any, seed: int, epoch: int) -> None:
    """Fix ``sampler``'s order for ``epoch``: a ``generator`` attribute gets one seeded from
    (seed, epoch), a ``set_epoch`` method is told the epoch (None and others: nothing)."""
    if hasattr(sampler, "generator"):
        sampler.generator = torch.Generator().manual_seed(mix_seed(seed, epoch))
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


class SeededBatch(list):
    """A batch of dataset indices carrying the seed for its augmentation."""

    def __init__(self, indices: Iterable[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed

    def __reduce__(self) -> tuple[Any, ...]:
        return (SeededBatch, (list(self), self.seed))


class SeededDataset(torch.utils.data.Dataset):
    """Fetches a batch after seeding the worker's generators from the batch's seed."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if isinstance(indices, SeededBatch) and get_worker_info() is not None:
            seed_all(indices.seed)
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(list(indices)))
        return [self.dataset[i] for i in indices]


class EpochBatches(Sampler[list[int]]):
    """The batches of one epoch, fixed by (seed, epoch), starting after ``skip`` batches.

    Samplers with a ``generator`` attribute (``RandomSampler``, ``WeightedRandomSampler``,
    ``SubsetRandomSampler``) get one seeded from (seed, epoch); samplers with ``set_epoch``
    (``DistributedSampler``) are told the epoch.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], seed: int, seeded: bool) -> None:
        self.batch_sampler = batch_sampler
        self.seed = seed
        self.seeded = seeded  # worker processes need each batch's seed; the main process not
        self.epoch = 0
        self.skip = 0

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, skip = self.epoch, self.skip
        for obj in (getattr(self.batch_sampler, "sampler", None), self.batch_sampler):
            seed_epoch(obj, self.seed, epoch)
        batches = itertools.islice(iter(self.batch_sampler), skip, None)
        if not self.seeded:
            yield from batches
            return
        for number, indices in enumerate(batches, start=skip):
            yield SeededBatch(indices, mix_seed(self.seed, epoch, number))


class ResumableLoader:
    """A ``DataLoader`` rebuilt so that any epoch can start at any batch; its workers ignore
    ``quiet_signals`` (the run's stop signals, which the main process acts on)."""

    def __init__(
        self,
        loader: DataLoader,
        seed: int,
        sampler: Sampler | None = None,
        quiet_signals: Sequence[int] = (),
    ) -> None:
        self.original = loader
        batch_sampler = loader.batch_sampler
        if sampler is not None:
            assert loader.batch_size is not None
            batch_sampler = BatchSampler(sampler, loader.batch_size, loader.drop_last)
        assert batch_sampler is not None
        workers = loader.num_workers
        self.batches = EpochBatches(batch_sampler, seed, seeded=workers > 0)
        # read once, as every loader's: reports ask for the run's length (a chain of
        # ``__len__`` calls through the samplers down to the dataset)
        self.length: int = len(batch_sampler)  # type: ignore[arg-type]
        """Batches per epoch."""
        options = loader_options(loader)
        self.quiet = workers > 0 and bool(quiet_signals)
        if self.quiet:
            user_init = options["worker_init_fn"]
            options["worker_init_fn"] = functools.partial(_quiet_worker, quiet_signals, user_init)
        self.loader = DataLoader(
            SeededDataset(loader.dataset) if workers > 0 else loader.dataset,
            batch_sampler=self.batches,
            generator=torch.Generator().manual_seed(mix_seed(seed, -1)),
            **options,
        )

    stream = False
    """Its length is known: it is its batch sampler's."""

    @property
    def dataset(self) -> Any:
        return self.original.dataset

    def __len__(self) -> int:
        return self.length

    def epoch_iter(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        self.batches.epoch = epoch
        self.batches.skip = skip
        iterator = iter(self.loader)
        if self.quiet:
            _QUIET_ITERATORS.add(iterator)
            _QUIET_WORKERS.update(getattr(iterator, "_workers", ()))
        return iterator

    def close(self) -> None:
        """End the workers of a persistent iterator (a run's end): the next epoch starts new
        ones. Done here rather than left to the garbage collector, whose ``__del__`` shutdown
        cannot end workers that ignore SIGTERM."""
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and self.quiet:
            end_workers(iterator)
            self.loader._iterator = None

    def continue_epoch(self, epoch: int, batches_done: int, saved_world: int) -> int | None:
        """Continue ``epoch`` after ``batches_done`` batches of each of ``saved_world`` ranks
        (the samples they used, on this run's ranks; see :mod:`hookrun.data.sharding`). Returns
        the batches of the epoch to count as done here; None when the sampler is not
        hookrun's to shard (a ``DistributedSampler`` of the user's, an already sharded
        loader)."""
        batch_sampler = self.batches.batch_sampler
        sampler: Any = getattr(batch_sampler, "sampler", None)
        if not isinstance(batch_sampler, BatchSampler) or not hasattr(sampler, "continue_epoch"):
            return None
        used = batches_done * batch_sampler.batch_size * saved_world
        return int(
            sampler.continue_epoch(epoch, used, batch_sampler.batch_size, batch_sampler.drop_last)
        )


def loader_options(loader: DataLoader) -> dict[str, Any]:
    """What a ``DataLoader`` rebuilt over the same dataset keeps of ``loader``: collation,
    workers, pinning, timeouts (its sampling and generator are the rebuilder's own)."""
    workers = loader.num_workers
    return {
        "num_workers": workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "prefetch_factor": loader.prefetch_factor if workers > 0 else None,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
        "in_order": getattr(loader, "in_order", True),
    }


def _quiet_worker(
    numbers: Sequence[int], user_init: Callable[[int], None] | None, worker_id: int
) -> None:
    """A worker's start: ignore the stop signals, then the user's ``worker_init_fn``. Runs
    after torch's own worker setup, which ends a worker on any SIGTERM not from its parent;
    SLURM and torchrun signal the whole process group, workers included."""
    for number in numbers:
        signal.signal(number, signal.SIG_IGN)
    if user_init is not None:
        user_init(worker_id)


def make_loader(
    loader: Any,
    seed: int,
    sampler: Sampler | None = None,
    quiet_signals: Sequence[int] = (),
    stateful: bool = False,
) -> ResumableLoader | PlainLoader | StatefulLoader | None:
    """Wrap what the user passed; map-style ``DataLoader``s get exact resume, and with
    ``stateful`` (the train loader) a loader with its own ``state_dict`` resumes by it."""
    if loader is None:
        return None
    if stateful and is_stateful(loader):
        return StatefulLoader(loader)
    if (
        isinstance(loader, DataLoader)
        and loader.batch_size is not None
        and not isinstance(loader.dataset, IterableDataset)
    ):
        return ResumableLoader(loader, seed, sampler, quiet_signals)
    return PlainLoader(loader)

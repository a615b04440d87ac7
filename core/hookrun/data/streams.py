"""Loaders hookrun iterates as they are: any re-iterable of batches, streams included
(:class:`PlainLoader`), and a train loader that keeps its own position
(:class:`StatefulLoader`: torchdata's ``StatefulDataLoader``, or any loader with
``state_dict()``/``load_state_dict(state)``).

hookrun uses a stateful loader as it is (its sampling, workers and dataset iteration are its
own) and saves its ``state_dict()`` with every checkpoint, one per rank
(:mod:`hookrun.checkpoint.state`). A resume hands the saved state back before the first
epoch it iterates, so the loader continues from the batch after the last one trained,
mid-epoch included, and its random sampler goes on with the generator it had. Under
torch.distributed it must yield this rank's share already (a ``DistributedSampler``, or
:func:`hookrun.already_sharded`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def sized(iterable: Any) -> int | None:
    """``len(iterable)``, or None for a stream (no ``__len__``, or one that raises
    ``TypeError``, as a ``DataLoader`` over an ``IterableDataset`` without one does)."""
    try:
        return len(iterable)
    except TypeError:
        return None


def is_stateful(loader: Any) -> bool:
    """Whether ``loader`` saves and restores its own position (torchdata's
    ``StatefulDataLoader``): ``state_dict()`` and ``load_state_dict(state)``."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


class PlainLoader:
    """A re-iterable of batches that is not a map-style ``DataLoader``; resuming mid-epoch
    skips by iterating past batches.

    A stream (no ``__len__``) ends its epoch when its iterator does; ``length`` is None
    until the training loop has seen an epoch end (then that epoch's batches, for estimates:
    the loop itself never relies on it). A stream is not skipped into: it restarts its epoch
    (:func:`hookrun.checkpoint.state.restore` says so)."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.original = iterable
        self.dataset = getattr(iterable, "dataset", None)
        self.length = sized(iterable)
        self.stream = self.length is None

    def __len__(self) -> int:
        return len(self.original)  # type: ignore[arg-type]

    def close(self) -> None:
        """Nothing to end: the user's loader keeps its own workers."""

    def continue_epoch(self, epoch: int, batches_done: int, saved_world: int) -> int | None:
        """None: the iterable's sampling is its own, not hookrun's to deal out anew."""
        return None

    def epoch_iter(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        if hasattr(self.original, "set_epoch"):
            self.original.set_epoch(epoch)
        return itertools.islice(iter(self.original), skip, None)


class StatefulLoader(PlainLoader):
    """The train loader resumed by its own state (see the module); a stream's ``length`` as
    :class:`PlainLoader`'s."""

    original: Any  # with state_dict and load_state_dict (is_stateful)

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self.pending: Any = None  # a checkpoint's state, loaded before the next epoch starts

    def state_dict(self) -> Any:
        """The loader's own state: the batches it yielded so far in its epoch, its sampler's
        and dataset's state."""
        return self.original.state_dict()

    def epoch_iter(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        """The epoch's batches; after a resume, from where the saved state left off. A
        ``DistributedSampler`` is told the epoch, as in a loop written by hand."""
        sampler = getattr(self.original, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        if self.pending is None:  # no saved state, or a checkpoint without it: skip batches
            return super().epoch_iter(epoch, skip)
        if hasattr(self.original, "set_epoch"):
            self.original.set_epoch(epoch)
        self.original.load_state_dict(self.pending)
        self.pending = None
        # Building the restored iterator draws a base seed from torch's generator, which the
        # run never interrupted did not (it drew at the epoch's start, before the saved
        # random state): built aside here (``StatefulDataLoader.state_dict`` builds it), the
        # generator put back; an iterator restored at an epoch's end then gives way to the
        # next epoch's, which draws as the uninterrupted run did.
        rng = torch.get_rng_state()
        self.original.state_dict()
        torch.set_rng_state(rng)
        return iter(self.original)

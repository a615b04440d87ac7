"""A train loader that keeps its own position: torchdata's ``StatefulDataLoader``, or any
loader with ``state_dict()``/``load_state_dict(state)``.

hookrun uses it as it is (its sampling, workers and dataset iteration are its own) and saves
its ``state_dict()`` with every checkpoint, one per rank (:mod:`hookrun.checkpoint.state`).
A resume hands the saved state back before the first epoch it iterates, so the loader
continues from the batch after the last one trained, mid-epoch included, and its random
sampler goes on with the generator it had. Under torch.distributed it must yield this
rank's share already (a ``DistributedSampler``, or :func:`hookrun.already_sharded`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
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


class StatefulLoader:
    """The train loader resumed by its own state (see the module). Like
    :class:`~hookrun.data.loaders.PlainLoader`, a stream (no ``__len__``) has ``length``
    None until the training loop has seen an epoch end."""

    def __init__(self, loader: Any) -> None:
        self.original = loader  # with state_dict and load_state_dict (is_stateful)
        self.dataset = getattr(loader, "dataset", None)
        self.length = sized(loader)
        self.stream = self.length is None
        self.pending: Any = None  # a checkpoint's state, loaded before the next epoch starts

    def __len__(self) -> int:
        return len(self.original)

    def close(self) -> None:
        """Nothing to end: the user's loader keeps its own workers."""

    def continue_epoch(self, epoch: int, batches_done: int, saved_world: int) -> int | None:
        """None: its sampling is its own, not hookrun's to deal out anew."""
        return None

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
        if hasattr(self.original, "set_epoch"):
            self.original.set_epoch(epoch)
        if self.pending is not None:
            self.original.load_state_dict(self.pending)
            self.pending = None
            # Building the restored iterator draws a base seed from torch's generator, which
            # the run never interrupted did not (it drew at the epoch's start, before the
            # saved random state): built aside here (``StatefulDataLoader.state_dict`` builds
            # it), the generator put back; an iterator restored at an epoch's end then gives
            # way to the next epoch's, which draws as the uninterrupted run did.
            rng = torch.get_rng_state()
            self.original.state_dict()
            torch.set_rng_state(rng)
            return iter(self.original)
        # a checkpoint without the loader's state (saved before it was stateful): skip
        return itertools.islice(iter(self.original), skip, None)

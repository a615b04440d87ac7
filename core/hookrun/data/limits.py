"""Debugging limits: a loader cut to its first batches (``limit_train_batches``,
``limit_val_batches``), everything else the wrapped loader's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any


class LimitedLoader:
    """The first ``limit`` batches of each epoch of a wrapped loader (a
    :class:`~hookrun.data.loaders.ResumableLoader` or a
    :class:`~hookrun.data.streams.PlainLoader`); resuming at batch ``skip`` skips as the
    wrapped loader does."""

    def __init__(self, loader: Any, limit: int) -> None:
        self.inner = loader
        self.limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return min(len(self.inner), self.limit)

    @property
    def length(self) -> int | None:
        """Batches per epoch: the limit, or fewer when the wrapped loader has fewer; None for
        a stream, whose epoch may end before the limit."""
        inner = self.inner.length
        return None if inner is None else min(inner, self.limit)

    @length.setter
    def length(self, batches: int) -> None:
        """A stream's epoch length once its first (limited) epoch ended."""
        self.inner.length = batches

    def epoch_iter(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        return itertools.islice(self.inner.epoch_iter(epoch, skip), max(self.limit - skip, 0))

    def close(self) -> None:
        self.inner.close()


def limited(loader: Any, limit: int | None) -> Any:
    """``loader`` cut to ``limit`` batches per epoch; as it is without a limit (or None)."""
    return loader if loader is None or limit is None else LimitedLoader(loader, limit)

"""Weights swapped into a model for evaluation, undone in reverse order of swapping in.

Several plugins may swap weights into one model (two EMA plugins, for instance). pluggy calls
``after_val`` in the same order as ``before_val``, so the first plugin to swap in would swap
out first, while a later swap still sits on top of it, and the trained weights would end up
somewhere else. Each model's :class:`SwapStack` keeps the swaps in it and undoes them newest
first, whatever order the plugins ask in.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Protocol

from torch import nn


class Swap(Protocol):
    """One plugin's weights: ``swap_in`` puts them into the model, keeping aside what the
    model held; ``swap_out`` gives that back (and keeps edits made meanwhile)."""

    def swap_in(self) -> None: ...

    def swap_out(self) -> None: ...


class SwapStack:
    """The swaps in one model, oldest first; only the newest is ever swapped out.

    ``push`` swaps in on top of whatever the model holds. ``remove`` takes one swap out from
    any depth: the swaps above it are swapped out newest first, then it, and they go back in
    oldest first, so each one keeps its own weights and the model ends up holding what it held
    before. ``exposed`` holds one swap's weights (or the trained weights) in the model for a
    block, for reading them while later swaps sit on top.

    Attributes:
        entries: the swaps in the model now, oldest first.
    """

    def __init__(self) -> None:
        self.entries: list[Swap] = []

    def __contains__(self, swap: object) -> bool:
        return any(entry is swap for entry in self.entries)

    def push(self, swap: Swap) -> None:
        """Swap ``swap`` in, on top."""
        swap.swap_in()
        self.entries.append(swap)

    def remove(self, swap: Swap) -> None:
        """Swap ``swap`` out, from wherever it is; the swaps above it stay in."""
        with self._unwound(self._index(swap)):
            swap.swap_out()
            self.entries.pop()

    @contextlib.contextmanager
    def exposed(self, swap: Swap | None = None) -> Iterator[None]:
        """For the block, ``swap``'s weights in the model (``None``: the trained weights):
        the swaps above it out, newest first, and back in after the block."""
        with self._unwound(-1 if swap is None else self._index(swap)):
            yield

    @contextlib.contextmanager
    def _unwound(self, index: int) -> Iterator[None]:
        """The swaps above ``index`` out for the block, then back in, oldest first."""
        above = self.entries[index + 1 :]
        for entry in reversed(above):
            entry.swap_out()
            self.entries.pop()
        try:
            yield
        finally:
            for entry in above:
                self.push(entry)

    def _index(self, swap: Swap) -> int:
        for index, entry in enumerate(self.entries):
            if entry is swap:
                return index
        raise ValueError(f"{swap!r} is not swapped into this model")


_STACKS: weakref.WeakKeyDictionary[nn.Module, SwapStack] = weakref.WeakKeyDictionary()


def swap_stack(model: nn.Module) -> SwapStack:
    """The :class:`SwapStack` of ``model`` (``runner.unwrapped_model``), shared by every plugin
    that swaps weights into it."""
    stack = _STACKS.get(model)
    if stack is None:
        stack = _STACKS[model] = SwapStack()
    return stack

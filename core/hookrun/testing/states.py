"""Comparing training states bit for bit, nested or in checkpoint files, with messages that
name the path where two states differ."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested state (dicts, lists, tuples), by ``/``-separated path."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from tensors(value, f"{prefix}/{i}")


def assert_states_equal(left: Any, right: Any, path: str = "state") -> None:
    """Two nested states are equal: same keys and lengths, tensors equal bit for bit (dtype and
    shape too), floats equal or both NaN, everything else ``==``; the message names the path."""
    import torch

    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        assert isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor), path
        assert left.dtype == right.dtype, f"{path}: dtype {left.dtype} != {right.dtype}"
        assert left.shape == right.shape, f"{path}: shape {left.shape} != {right.shape}"
        assert torch.equal(left, right) or (
            left.is_floating_point() and torch.equal(left.isnan(), right.isnan())
            and torch.equal(left.nan_to_num(), right.nan_to_num())
        ), f"{path}: values differ"  # fmt: skip
    elif isinstance(left, Mapping):
        assert isinstance(right, Mapping), f"{path}: {type(right).__name__} is not a mapping"
        assert list(left) == list(right), f"{path}: keys {list(left)} != {list(right)}"
        for key in left:
            assert_states_equal(left[key], right[key], f"{path}[{key!r}]")
    elif isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple)), f"{path}: {type(right).__name__} is no sequence"
        assert len(left) == len(right), f"{path}: length {len(left)} != {len(right)}"
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_states_equal(a, b, f"{path}[{i}]")
    elif isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        assert math.isnan(right), f"{path}: nan != {right}"
    else:
        assert left == right, f"{path}: {left!r} != {right!r}"


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint file's contents, read on the CPU the way hookrun reads every checkpoint
    (``weights_only``; one-line errors): what a test asserts about a file on disk."""
    from hookrun.checkpoint.files import load

    return load(path)


def assert_same_checkpoint(
    a: str | Path, b: str | Path, min_tensors: int = 10, plugins: Iterable[str] = ()
) -> None:
    """Two checkpoint files hold the same training state: every tensor (weights, optimizer,
    RNGs, plugin tensors) bit for bit, the loop position, the scheduler and the iteration;
    the whole state of each plugin in ``plugins`` too (others may hold timings)."""
    import torch

    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    left_t, right_t = dict(tensors(left)), dict(tensors(right))
    assert left_t.keys() == right_t.keys()
    assert len(left_t) > min_tensors, f"only {len(left_t)} tensors in {a}"
    for key, value in left_t.items():
        assert torch.equal(value, right_t[key]), key
    assert left["loop"] == right["loop"]
    assert (left["meta"]["epoch"], left["meta"]["iter"]) == (
        right["meta"]["epoch"],
        right["meta"]["iter"],
    )
    assert left.get("scheduler") == right.get("scheduler")
    for name in plugins:
        assert_states_equal(left["plugins"][name], right["plugins"][name], f"plugins[{name!r}]")

"""Scalars recorded during training, kept on device until a logging interval reads them."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


class ScalarStore:
    """The latest value and a bounded history per name; values may be device tensors.

    Each name is a *series* (``put``: the core's report writes its mean over the values put
    since the previous report) or a *gauge* (``gauge``: the report writes its latest value,
    which may be any object with ``__float__``, computed when read). ``put`` and ``gauge``
    never synchronise with the device; reading moves everything asked for to the host in one
    transfer per device, so a run pays one sync per report.

    ``batched=False`` reads values one by one instead: the runner's choice on the CPU, where
    a read costs nothing and ``float()`` per value is cheaper than stacking (a report's
    torch ops run with cold caches, 50 iterations after the last).
    """

    def __init__(self, window: int = 100, batched: bool = True) -> None:
        self.window = window
        """How many values of each name the store keeps (for ``mean`` and ``history``)."""
        self.batched = batched
        """Whether a read moves every value to the host in one transfer (else one by one)."""
        # Each name's values in two parts: those put since its last report (the next
        # report's series), and those reported before; together its kept history.
        self._fresh: dict[str, deque[Any]] = {}
        self._reported: dict[str, deque[Any]] = {}
        self._gauges: set[str] = set()

    def put(self, name: str, value: Any) -> None:
        """Add a value to the series ``name``."""
        self.appender(name)(value)

    def appender(self, name: str) -> Callable[[Any], None]:
        """What ``put(name, value)`` does, as a C method to call with the value: the training
        step puts its loss so every iteration, without a Python frame."""
        fresh = self._fresh.get(name)
        if fresh is None:
            fresh = self._fresh[name] = deque(maxlen=self.window)
            self._reported[name] = deque(maxlen=self.window)
        return fresh.append

    def update(self, values: Mapping[str, Any], prefix: str = "") -> None:
        """``put`` every value of ``values``, its name prefixed with ``prefix``."""
        for name, value in values.items():
            self.put(prefix + name, value)

    def gauge(self, name: str, value: Any) -> None:
        """Set the gauge ``name``: reports write its current value, not a mean. A computed
        gauge (an object with ``__float__``, not a tensor) reading NaN has no value yet and
        is left out."""
        self._gauges.add(name)
        self.put(name, value)

    def report(self, prefix: str = "train/") -> dict[str, float]:
        """Host floats of every ``prefix`` name for a report, in one transfer: series as the
        mean of the values put since the last report (the last ``window`` of them; names with
        none are left out), gauges as their latest value. Starts the next report's series."""
        pending: list[Any] = []
        names: list[str] = []
        for name, fresh in self._fresh.items():
            if not name.startswith(prefix):
                continue
            if name in self._gauges:
                value = self._last(name)
            elif not fresh:
                continue
            else:
                value = fresh[0] if len(fresh) == 1 else self._series_mean(list(fresh))
            names.append(name)
            pending.append(value)
            self._reported[name].extend(fresh)
            fresh.clear()
        return self._without_unset(names, pending)

    def _without_unset(self, names: list[str], values: list[Any]) -> dict[str, float]:
        """Host floats of ``values``, leaving out computed gauges with no value yet."""
        floats = to_floats(values) if self.batched else [float(value) for value in values]
        return {
            name: number
            for name, number, value in zip(names, floats, values, strict=True)
            if not (number != number and name in self._gauges and not torch.is_tensor(value))
        }

    def names(self) -> list[str]:
        """Every name put or gauged so far (since :meth:`clear`)."""
        return [name for name, fresh in self._fresh.items() if fresh or self._reported[name]]

    def latest(self, names: Iterable[str] | None = None) -> dict[str, float]:
        """Latest values as floats (one batched transfer)."""
        kept = self.names()
        keys = kept if names is None else [n for n in names if n in kept]
        return self._without_unset(keys, [self._last(k) for k in keys])

    def mean(
        self, names: Iterable[str] | None = None, window: int | None = None
    ) -> dict[str, float]:
        """Mean of the last ``window`` values of each name (one batched transfer)."""
        kept = self.names()
        keys = kept if names is None else [n for n in names if n in kept]
        flat: list[Any] = []
        counts = []
        for key in keys:
            values = self.history(key)[-(window or self.window) :]
            flat.extend(values)
            counts.append(len(values))
        floats = to_floats(flat) if self.batched else [float(value) for value in flat]
        out, start = {}, 0
        for key, count in zip(keys, counts, strict=True):
            out[key] = sum(floats[start : start + count]) / count
            start += count
        return out

    def history(self, name: str) -> list[Any]:
        """The kept values of ``name`` (the last ``window``), oldest first, as put (tensors
        stay on the device)."""
        if name not in self._fresh:
            return []
        values = [*self._reported[name], *self._fresh[name]]
        return values[-self.window :]

    def _last(self, name: str) -> Any:
        """The latest value of ``name`` (one was put)."""
        fresh = self._fresh[name]
        return fresh[-1] if fresh else self._reported[name][-1]

    def clear(self) -> None:
        """Forget every name and value; an :meth:`appender` taken before keeps putting."""
        for name, fresh in self._fresh.items():
            fresh.clear()
            self._reported[name].clear()
        self._gauges.clear()

    def _series_mean(self, values: list[Any]) -> Any:
        """Mean of a series' values in float64: read at once unless ``batched``."""
        if not self.batched:
            try:
                return math.fsum(map(float, values)) / len(values)
            except ValueError:  # a tensor of several elements: below
                pass
        return _device_mean(values)


def _device_mean(values: list[Any]) -> Any:
    """Mean of numbers and/or tensors in float64, left on the device: nothing is read here."""
    try:  # the usual case, same-shaped tensors on one device: two small ops
        return torch.stack(values).mean(dtype=torch.float64)
    except (TypeError, RuntimeError):  # numbers, objects with __float__, mixed devices
        total: Any = 0.0
        for value in values:
            is_tensor = isinstance(value, torch.Tensor)
            total = total + (value.detach().double().mean() if is_tensor else float(value))
        return total / len(values)


def to_floats(values: list[Any]) -> list[float]:
    """Floats for a mixed list of numbers and tensors, with one host transfer per device."""
    out: list[float] = [0.0] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            by_device.setdefault(value.device, []).append(i)
        else:
            out[i] = float(value)
    for indices in by_device.values():
        stacked = torch.stack([values[i].detach().reshape(()).to(torch.float64) for i in indices])
        for i, v in zip(indices, stacked.tolist(), strict=True):
            out[i] = v
    return out

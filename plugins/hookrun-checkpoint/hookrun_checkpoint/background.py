"""Checkpoint writes in a background thread, from a host copy that training cannot change."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hookrun import URL, CheckpointError


class BackgroundWriter:
    """At most one checkpoint write in flight, in a thread; its error surfaces in ``wait``."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.host = HostCopy()

    def submit(self, job: Callable[[], None], path: Path | URL) -> None:
        self.wait()

        def run() -> None:
            try:
                self.host.ready()
                job()
            except CheckpointError as exc:
                self.error = exc
            except BaseException as exc:  # a failure the core did not name: name the file
                self.error = CheckpointError(f"cannot write checkpoint {path}: {exc!r}")

        self.thread = threading.Thread(target=run, name="hookrun-checkpoint-writer")
        self.thread.start()

    def wait(self) -> None:
        """Block until the write in flight is done; raise its error here, in training."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        if error is not None:
            raise error

    def release(self) -> None:
        """Free the host buffers at the end of a run (they are reused within one)."""
        self.host = HostCopy()


class HostCopy:
    """A copy of a state that later training steps cannot change: tensors in host buffers
    (pinned for CUDA sources, copied without blocking), containers rebuilt.

    Storages shared between tensors stay shared and whole, and a tensor met twice is copied
    once, so ``torch.save`` of the copy writes the same bytes as of the original. Buffers are
    reused from one save to the next: allocating hundreds of MB afresh costs page faults.
    """

    def __init__(self) -> None:
        self.pool: list[torch.UntypedStorage] = []
        self.copies: dict[int, torch.UntypedStorage] = {}  # by source storage
        self.tensors: dict[int, torch.Tensor] = {}  # by id of the source tensor
        self.event: Any = None

    def copy(self, state: dict[str, Any]) -> dict[str, Any]:
        self.copies, self.tensors = {}, {}
        self.event = None
        copied = self._tree(state)
        if self.event is not None:
            self.event.record()
        return copied

    def ready(self) -> None:
        """Wait (in the writer thread) until copies from the device have landed."""
        if self.event is not None:
            self.event.synchronize()

    def _tree(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):  # one tensor twice stays one object, as in pickle
            if id(obj) not in self.tensors:
                self.tensors[id(obj)] = self._tensor(obj)
            return self.tensors[id(obj)]
        if type(obj) in (dict, OrderedDict):
            out = type(obj)((key, self._tree(value)) for key, value in obj.items())
            if getattr(obj, "__dict__", None):  # state_dict()'s _metadata (module versions)
                out.__dict__.update(_copy_plain(obj.__dict__))
            return out
        if type(obj) in (list, tuple):
            return type(obj)(self._tree(value) for value in obj)
        return obj  # numbers, strings and other immutable values

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout != torch.strided or tensor.device.type == "meta":
            return tensor.detach().to("cpu", copy=True)
        source = tensor.untyped_storage()
        target = self.copies.get(source._cdata)
        if target is None:
            on_device = tensor.device.type != "cpu"
            target = self._buffer(source.nbytes(), pinned=tensor.device.type == "cuda")
            target.copy_(source, non_blocking=on_device)
            if tensor.device.type == "cuda" and self.event is None:
                self.event = torch.cuda.Event()
            self.copies[source._cdata] = target
        view = torch.empty(0, dtype=tensor.dtype).set_(
            target, tensor.storage_offset(), tensor.size(), tensor.stride()
        )
        if isinstance(tensor, torch.nn.Parameter):
            return torch.nn.Parameter(view, requires_grad=tensor.requires_grad)
        return view.requires_grad_(tensor.requires_grad)

    def _buffer(self, nbytes: int, pinned: bool) -> torch.UntypedStorage:
        index = len(self.copies)
        if index < len(self.pool):
            buffer = self.pool[index]
            if buffer.nbytes() == nbytes and buffer.is_pinned() == pinned:
                return buffer
        buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        if index < len(self.pool):
            self.pool[index] = buffer
        else:
            self.pool.append(buffer)
        return buffer


def _copy_plain(obj: Any) -> Any:
    """A deep copy of nested dicts and lists of plain values."""
    if isinstance(obj, dict):
        return type(obj)((key, _copy_plain(value)) for key, value in obj.items())
    if isinstance(obj, list):
        return [_copy_plain(value) for value in obj]
    return obj

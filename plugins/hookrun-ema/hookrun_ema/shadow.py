"""The average itself: one tensor per state-dict entry of the model, updated with a few
``torch._foreach_*`` calls.

Under ``strategy: fsdp`` a parameter is a ``DTensor`` whose local shard is all this rank holds:
the average of it is kept as a plain tensor of the same local shard (updated against the
parameter's local shard, no collective), and is handed out as a ``DTensor`` laid out like the
parameter (checkpoints, export), so a sharded checkpoint writes it through DCP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookrun import (
    CheckpointMismatchError,
    broadcast_from_rank_0,
    is_dtensor,
    local_shard,
    swap_stack,
)


def shadow_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every narrower floating type is averaged in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Shadow:
    """The averaged copy of a model's state: one tensor per state-dict tensor (tied weights
    once), updated in up to three ``torch._foreach_*`` groups.

    - ``lerp``: averaged entries whose shadow has the model tensor's dtype and device;
    - ``mixed``: averaged entries of another dtype (bf16/fp16 weights) or device;
    - ``copy``: integer buffers, floating buffers with ``buffers: copy``, and parameters left
      out of the average (:meth:`average_only`).

    ``tensors`` are plain tensors; for a ``DTensor`` entry, this rank's shard of it.
    """

    def __init__(self, model: nn.Module, average_buffers: bool, device: str | None) -> None:
        self.model = model
        self.average_buffers = average_buffers
        self.stale = False
        self.device = torch.device(device) if device else None
        self.keys: list[str] = []
        self.targets: list[torch.Tensor] = []  # the model's own tensors (Parameters included)
        self.tensors: list[torch.Tensor] = []  # the average (local shards of DTensor entries)
        self.slots: dict[str, int] = {}  # every state-dict key (tied ones too) -> index
        params = {id(p) for p in model.parameters()}
        self.buffers: list[int] = []  # entries that are not parameters
        first: dict[int, int] = {}
        for key, value in model.state_dict(keep_vars=True).items():
            if not isinstance(value, torch.Tensor):
                continue
            if id(value) in first:
                self.slots[key] = first[id(value)]
                continue
            averaged = value.is_floating_point() and (average_buffers or id(value) in params)
            dtype = shadow_dtype(value.dtype) if averaged else value.dtype
            local = local_shard(value)
            tensor = local.detach().to(self.device or local.device, dtype, copy=True)
            index = len(self.keys)
            if id(value) not in params:
                self.buffers.append(index)
            first[id(value)] = self.slots[key] = index
            self.keys.append(key)
            self.targets.append(value)
            self.tensors.append(tensor)
        self.average_only(None)
        # exchanging storage is free, but FSDP gathers a DTensor parameter from storage of
        # its own: those entries are copied in and out
        self.sharded = any(is_dtensor(t) for t in self.targets)
        self.exchanged = [
            i
            for i, (t, s) in enumerate(zip(self.targets, self.tensors, strict=True))
            if t.dtype == s.dtype and t.device == s.device and not is_dtensor(t)
        ]
        exchanged = set(self.exchanged)
        self.copied = [i for i in range(len(self.keys)) if i not in exchanged]
        self.staged = self.device is not None and any(
            local_shard(t).device != self.device for t in self.targets
        )
        self.saved: list[tuple[torch.Tensor, int]] | None = None  # raw copies while swapped

    def average_only(self, params: set[int] | None) -> None:
        """Average the parameters whose ids are in ``params`` (None: every parameter) and
        copy the others at each update, so they follow the trained model (an EMA of one
        optimizer's parameters in a run with several)."""
        buffers = set(self.buffers)
        self.lerp: list[int] = []
        self.mixed: list[int] = []
        self.copy: list[int] = []
        for index, (target, tensor) in enumerate(zip(self.targets, self.tensors, strict=True)):
            if index in buffers:
                averaged = target.is_floating_point() and self.average_buffers
            else:
                averaged = target.is_floating_point() and (params is None or id(target) in params)
            local = local_shard(target)
            alike = tensor.dtype == local.dtype and tensor.device == local.device
            (self.copy if not averaged else self.lerp if alike else self.mixed).append(index)

    def _pick(self, group: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [self.tensors[i] for i in group], [local_shard(self.targets[i]) for i in group]

    def _sources(self, targets: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.staged:
            return targets
        return [t.detach().to(self.device) for t in targets]

    def update(self, decay: float) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` for averaged entries, copies for the
        rest; ``decay`` is a Python float, so nothing here waits for the device."""
        with torch.no_grad():
            if self.lerp:
                tensors, targets = self._pick(self.lerp)
                torch._foreach_lerp_(tensors, self._sources(targets), 1.0 - decay)
            if self.mixed:
                tensors, targets = self._pick(self.mixed)
                torch._foreach_mul_(tensors, decay)
                torch._foreach_add_(tensors, self._sources(targets), alpha=1.0 - decay)
            if self.copy:
                tensors, targets = self._pick(self.copy)
                torch._foreach_copy_(tensors, self._sources(targets))

    def broadcast_buffers(self) -> None:
        """Rank 0's averaged buffers on every rank."""
        for index in self.buffers:
            broadcast_from_rank_0(self.tensors[index])

    def refresh(self) -> None:
        """The average set to the trained weights (tracking before ``start_iter``), read
        from under any averages other plugins have swapped into the model."""
        self.stale = False
        with swap_stack(self.model).exposed(), torch.no_grad():
            targets = [local_shard(t) for t in self.targets]
            torch._foreach_copy_(self.tensors, self._sources(targets))

    def swap_in(self) -> None:
        """Put the average into the model: exchange storage where dtype and device match
        (free), else copy it in after keeping a copy of the trained value."""
        if self.stale:
            self.refresh()
        self._reshard()
        with torch.no_grad():
            for i in self.exchanged:
                _exchange(self.targets[i], self.tensors[i])
            self.saved = []
            for i in self.copied:
                target = local_shard(self.targets[i])
                raw = target.detach().clone()
                target.copy_(self.tensors[i])
                self.saved.append((raw, target._version))

    def swap_out(self) -> None:
        """Give the trained weights back; copied-in entries edited meanwhile keep the edit."""
        assert self.saved is not None
        self._reshard()
        with torch.no_grad():
            for i in self.exchanged:
                _exchange(self.targets[i], self.tensors[i])
            for i, (raw, version) in zip(self.copied, self.saved, strict=True):
                target = local_shard(self.targets[i])
                if target._version != version:
                    self.tensors[i].copy_(target)
                target.copy_(raw)
        self.saved = None

    def _reshard(self) -> None:
        """Under FSDP, drop the gathered copies of the parameters a forward may have left
        (with ``reshard_after_forward: false`` a unit keeps them after an evaluation
        forward): the next forward then gathers what the shards hold now, the average or the
        trained weights."""
        if not self.sharded:
            return
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def current(self) -> list[torch.Tensor]:
        """The tensors holding the average now (the model's own while exchanged in; copies
        of them while another plugin's swap sits on top of this one)."""
        if self.stale:
            self.refresh()
        if self.saved is None:
            return self.tensors
        stack = swap_stack(self.model)
        if stack.entries[-1] is not self:
            with stack.exposed(self):
                return [t.clone() for t in self._held()]
        return self._held()

    def _held(self) -> list[torch.Tensor]:
        """While on top of the swap stack: the tensors holding the average."""
        current = list(self.tensors)
        for i in self.exchanged:
            current[i] = self.targets[i].detach()
        return current

    def raw_state(self) -> dict[str, torch.Tensor]:
        """While swapped in: every state-dict key to the tensor holding the trained value
        (this average's kept-aside tensors when it was swapped in first, else copies)."""
        assert self.saved is not None
        stack = swap_stack(self.model)
        if stack.entries[0] is not self:
            with stack.exposed():
                raw = {
                    i: self._wrap(i, local_shard(t).detach().clone())
                    for i, t in enumerate(self.targets)
                }
            return {key: raw[i] for key, i in self.slots.items()}
        raw = {i: self.tensors[i] for i in self.exchanged}
        raw.update(
            {i: self._wrap(i, saved) for i, (saved, _) in zip(self.copied, self.saved, strict=True)}
        )
        return {key: raw[i] for key, i in self.slots.items()}

    def export(self) -> dict[str, Any]:
        """The average as ``model.state_dict()`` would hold it: same keys, same dtypes (and
        ``DTensor`` shards where the model has them)."""
        state = self.model.state_dict()
        current = self.current()
        for key, i in self.slots.items():
            state[key] = self._wrap(i, current[i].to(self.targets[i].dtype))
        return state

    def exact(self) -> dict[str, torch.Tensor]:
        """Entries whose average is wider than the model's dtype, as kept (for resume)."""
        current = self.current()
        return {
            key: self._wrap(i, current[i])
            for i, key in enumerate(self.keys)
            if current[i].dtype != self.targets[i].dtype
        }

    def _wrap(self, index: int, local: torch.Tensor) -> torch.Tensor:
        """``local`` (this rank's part of entry ``index``) laid out as the model's tensor."""
        target = self.targets[index]
        if not is_dtensor(target):
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local.to(target.to_local().device),
            target.device_mesh,
            target.placements,
            run_check=False,
            shape=target.shape,
            stride=target.stride(),
        )

    def load(self, state: dict[str, Any]) -> None:
        """Take a saved average: whole tensors, or ``DTensor`` shards of any layout (a
        sharded checkpoint, resharded to this run's ranks)."""
        saved, exact = state["model"], state.get("shadow", {})
        missing = [key for key in self.keys if key not in saved]
        if missing:
            raise CheckpointMismatchError(
                f"plugins.ema: the saved average lacks {len(missing)} of the model's entries "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        current = self.current()
        with torch.no_grad():
            for i, key in enumerate(self.keys):
                value = exact.get(key, saved[key])
                if value.shape != self.targets[i].shape:
                    raise CheckpointMismatchError(
                        f"plugins.ema: saved average of {key!r} has shape {tuple(value.shape)}, "
                        f"the model's is {tuple(self.targets[i].shape)}"
                    )
                current[i].copy_(_part(value, self.targets[i]))
        self.stale = False


def _part(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The part of the saved ``value`` that this rank keeps for the model's ``target``."""
    if not is_dtensor(target):
        return value.full_tensor() if is_dtensor(value) else value
    if not is_dtensor(value):  # whole (a file checkpoint): this rank's chunk of it
        from torch.distributed.tensor import distribute_tensor

        device = target.to_local().device
        return distribute_tensor(
            value.to(device), target.device_mesh, target.placements, src_data_rank=None
        ).to_local()
    if value.placements != target.placements:
        value = value.redistribute(target.device_mesh, target.placements)
    return value.to_local()


def _exchange(target: torch.Tensor, tensor: torch.Tensor) -> None:
    """Swap the storage behind two tensors of one dtype and device; both objects stay."""
    raw = target.data
    target.data = tensor.data
    tensor.data = raw

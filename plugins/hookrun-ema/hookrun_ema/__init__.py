"""Exponential moving average (EMA) of a model's weights.

After every ``update_interval``-th optimizer step the average moves towards the new weights,
``ema = d * ema + (1 - d) * weights`` (so gradient accumulation needs no setting of its own).
It is kept in float32 (float64 for float64 weights): a bf16 average at decay 0.9999 rounds
most updates away and stalls. Updates are a few ``torch._foreach_*`` calls with a
Python-float decay, so they never wait for the device.
Validation and test run with the average swapped into the model by exchanging tensor storage
(no copy), and the trained weights are given back afterwards, also when evaluation raises.
Checkpoints hold the average as a state dict that loads straight into the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from hookrun import (
    CheckpointMismatchError,
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    dist,
    hookimpl,
)


class EMASettings(PluginSettings):
    decay: float = Field(
        0.9998,
        gt=0,
        lt=1,
        description="Weight of the old average at each update: "
        "ema = decay * ema + (1 - decay) * weights.",
    )
    warmup: bool = Field(
        True,
        description="Use decay_t = min(decay, (1 + t) / (10 + t)) at the t-th update (t from 0), "
        "so the early average forgets the initial weights quickly.",
    )
    update_interval: int = Field(
        1,
        ge=1,
        description="Update after every `update_interval`-th optimizer step of the run (steps "
        "skipped by a `before_optimizer_step` hook do not count).",
    )
    start_iter: int = Field(
        0,
        ge=0,
        description="The average is a copy of the weights until `start_iter` iterations are "
        "done; averaging starts with iteration `start_iter` (0-based).",
    )
    buffers: Literal["copy", "average"] = Field(
        "copy",
        description="Floating buffers (BatchNorm running statistics): `copy` the model's at each "
        "update, or `average` them like parameters. Integer buffers are always copied.",
    )
    device: Literal["cpu"] | None = Field(
        None,
        description="Where the average lives: null = beside each weight; `cpu` saves accelerator "
        "memory for a device-to-host copy (and a wait) per update.",
    )
    evaluate: Literal["ema", "raw", "both"] = Field(
        "ema",
        description="Weights used by validation and test: `ema`, `raw` (the trained weights), or "
        "`both` (raw metrics plus `ema/<name>` ones from a second pass with the average).",
    )


class EMA(Plugin[EMASettings]):
    """Keeps the moving average of ``runner.unwrapped_model``, swaps it in for evaluation and
    stores it in checkpoints."""

    name = "ema"
    Settings = EMASettings
    priority = Priority.NORMAL
    enabled_by_default = False

    def __init__(self, settings: EMASettings | None = None) -> None:
        super().__init__(settings)
        self.shadow: Shadow | None = None
        self.updates = 0  # averaging updates done: the t of the warm-up formula
        self.steps: int | None = 0  # optimizer steps seen; None: unknown (an older checkpoint)
        self._pending: dict[str, Any] | None = None  # state loaded before the model was seen
        self._swaps = 0  # nesting depth of swapped_in()

    # -- training ------------------------------------------------------------------------

    @hookimpl
    def before_run(self, runner: RunnerProtocol) -> None:
        """Under FSDP the average would have to be kept as shards: not done yet, so refused
        before any work rather than saved in a form no checkpoint can hold."""
        if runner.strategy == "fsdp":
            raise ConfigError(
                "plugins.ema: not available with runner.strategy fsdp yet (the average is not "
                "kept as shards); turn the plugin off or use strategy ddp"
            )

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        self._shadow_of(runner.unwrapped_model)
        if self.steps is None:  # older checkpoints counted iterations: exact without accumulation
            self.steps = runner.iter // runner.grad_accum

    @hookimpl
    def after_optimizer_step(self, runner: RunnerProtocol) -> None:
        shadow, settings = self.shadow, self.settings
        assert shadow is not None and self.steps is not None
        self.steps += 1
        if runner.iter < settings.start_iter:
            shadow.stale = True  # copied from the weights when next looked at
        elif self.steps % settings.update_interval == 0:
            t = self.updates
            decay = min(settings.decay, (1 + t) / (10 + t)) if settings.warmup else settings.decay
            shadow.update(decay)
            self.updates = t + 1

    def unused_hooks(self, runner: RunnerProtocol) -> set[str]:
        """Without ``start_iter`` there is no end of tracking to catch every iteration."""
        return {"after_train_iter"} if self.settings.start_iter == 0 else set()

    @hookimpl
    def after_train_iter(self, runner: RunnerProtocol) -> None:
        """Tracking ends: averaging starts from the weights the first ``start_iter`` iterations
        left, which under accumulation may come from a step some iterations back."""
        if runner.iter + 1 == self.settings.start_iter:
            assert self.shadow is not None
            self.shadow.refresh()

    @hookimpl
    def after_train_epoch(self, runner: RunnerProtocol) -> None:
        """Under torch.distributed each rank's BatchNorm statistics come from its own batches:
        every rank takes rank 0's averaged buffers, as the core does for the model's."""
        if runner.world_size > 1 and self.shadow is not None:
            self.shadow.broadcast_buffers()

    # -- evaluation ----------------------------------------------------------------------

    @hookimpl
    def before_val(self, runner: RunnerProtocol) -> None:
        if self.settings.evaluate == "ema":
            self._swap_in(runner.unwrapped_model)

    @hookimpl
    def after_val_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        if self.settings.evaluate == "both":
            self._add_ema_metrics(runner, metrics, runner.val_dataloader, "val")

    @hookimpl
    def after_val(self) -> None:
        if self.settings.evaluate == "ema":
            self._swap_out()

    @hookimpl
    def before_test(self, runner: RunnerProtocol) -> None:
        if self.settings.evaluate == "ema":
            self._swap_in(runner.unwrapped_model)

    @hookimpl
    def after_test_epoch(self, runner: RunnerProtocol, metrics: dict[str, float]) -> None:
        if self.settings.evaluate == "both":
            self._add_ema_metrics(runner, metrics, runner.test_dataloader, "test")

    @hookimpl
    def after_test(self) -> None:
        if self.settings.evaluate == "ema":
            self._swap_out()

    @hookimpl
    def on_exception(self) -> None:
        while self._swaps:
            self._swap_out()

    @hookimpl
    def extra_models(self, runner: RunnerProtocol) -> dict[str, Any]:
        self._shadow_of(runner.unwrapped_model)
        return {"ema": self.swapped_in}

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The average in the model's tensors for the ``with`` block, then the trained weights
        again. Edits made to the model inside the block (a BatchNorm statistics pass) stay in
        the average."""
        assert self.shadow is not None
        self._swap_in(self.shadow.model)
        try:
            yield
        finally:
            self._swap_out()

    def _add_ema_metrics(
        self, runner: RunnerProtocol, metrics: dict[str, float], loader: Any, mode: str
    ) -> None:
        self._shadow_of(runner.unwrapped_model)
        with self.swapped_in():
            ema_metrics = runner.evaluate(loader, mode)
        metrics.update({f"ema/{k}": v for k, v in ema_metrics.items()})

    def _swap_in(self, model: nn.Module) -> None:
        """The average into the model's tensors. Under DDP the core gives every rank rank
        0's buffers after the ``before_val``/``before_test`` hooks, so all ranks evaluate
        (and save) one average."""
        shadow = self._shadow_of(model)
        if self._swaps == 0:
            shadow.swap_in()
        self._swaps += 1

    def _swap_out(self) -> None:
        if self._swaps == 0:
            return
        self._swaps -= 1
        if self._swaps == 0:
            assert self.shadow is not None
            self.shadow.swap_out()

    # -- checkpoints ---------------------------------------------------------------------

    @hookimpl
    def before_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint taken during evaluation (a best-metric save) must still hold the
        trained weights as its model, not the average swapped into it."""
        if self._swaps and self.shadow is not None:
            checkpoint["model"].update(self.shadow.raw_state())

    def state_dict(self) -> dict[str, Any]:
        """``model``: the average as the model's own state dict (its dtypes, buffers included),
        ready for ``model.load_state_dict``; ``shadow``: the float32 values of the entries
        whose model dtype is narrower; ``updates``: the warm-up step count; ``steps``: the
        optimizer steps seen, which ``update_interval`` counts."""
        if self.shadow is None:
            return dict(self._pending or {})
        return {
            "model": self.shadow.export(),
            "shadow": self.shadow.exact(),
            "updates": self.updates,
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:  # saved before the plugin had seen a model
            return
        if self.shadow is None:
            self._pending = state  # applied when the model is first seen
            return
        self.shadow.load(state)
        self.updates = int(state["updates"])
        steps = state.get("steps")
        self.steps = None if steps is None else int(steps)

    def _shadow_of(self, model: nn.Module) -> Shadow:
        """The average, built from ``model`` on first use (and filled from a loaded state)."""
        if self.shadow is None:
            self.shadow = Shadow(model, self.settings.buffers == "average", self.settings.device)
            if self._pending is not None:
                state, self._pending = self._pending, None
                self.load_state_dict(state)
        return self.shadow


def shadow_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every narrower floating type is averaged in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Shadow:
    """The averaged copy of a model's state: one tensor per state-dict tensor (tied weights
    once), updated in up to three ``torch._foreach_*`` groups.

    - ``lerp``: averaged entries whose shadow has the model tensor's dtype and device;
    - ``mixed``: averaged entries of another dtype (bf16/fp16 weights) or device;
    - ``copy``: integer buffers, and floating buffers with ``buffers: copy``.
    """

    def __init__(self, model: nn.Module, average_buffers: bool, device: str | None) -> None:
        self.model = model
        self.stale = False
        self.device = torch.device(device) if device else None
        self.keys: list[str] = []
        self.targets: list[torch.Tensor] = []  # the model's own tensors (Parameters included)
        self.tensors: list[torch.Tensor] = []  # the average
        self.slots: dict[str, int] = {}  # every state-dict key (tied ones too) -> index
        params = {id(p) for p in model.parameters()}
        self.buffers: list[int] = []  # entries that are not parameters
        first: dict[int, int] = {}
        lerp: list[int] = []
        mixed: list[int] = []
        copy: list[int] = []
        for key, value in model.state_dict(keep_vars=True).items():
            if not isinstance(value, torch.Tensor):
                continue
            if id(value) in first:
                self.slots[key] = first[id(value)]
                continue
            averaged = value.is_floating_point() and (average_buffers or id(value) in params)
            dtype = shadow_dtype(value.dtype) if averaged else value.dtype
            tensor = value.detach().to(self.device or value.device, dtype, copy=True)
            index = len(self.keys)
            if id(value) not in params:
                self.buffers.append(index)
            first[id(value)] = self.slots[key] = index
            self.keys.append(key)
            self.targets.append(value)
            self.tensors.append(tensor)
            alike = tensor.dtype == value.dtype and tensor.device == value.device
            (copy if not averaged else lerp if alike else mixed).append(index)
        self.lerp, self.mixed, self.copy = lerp, mixed, copy
        self.exchanged = [
            i
            for i, (t, s) in enumerate(zip(self.targets, self.tensors, strict=True))
            if t.dtype == s.dtype and t.device == s.device
        ]
        exchanged = set(self.exchanged)
        self.copied = [i for i in range(len(self.keys)) if i not in exchanged]
        self.staged = self.device is not None and any(t.device != self.device for t in self.targets)
        self.saved: list[tuple[torch.Tensor, int]] | None = None  # raw copies while swapped

    def _pick(self, group: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return [self.tensors[i] for i in group], [self.targets[i] for i in group]

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
            dist.broadcast_from_rank_0(self.tensors[index])

    def refresh(self) -> None:
        """The average set to the current weights (tracking before ``start_iter``)."""
        with torch.no_grad():
            torch._foreach_copy_(self.tensors, self._sources(self.targets))
        self.stale = False

    def swap_in(self) -> None:
        """Put the average into the model: exchange storage where dtype and device match
        (free), else copy it in after keeping a copy of the trained value."""
        if self.stale:
            self.refresh()
        with torch.no_grad():
            for i in self.exchanged:
                _exchange(self.targets[i], self.tensors[i])
            self.saved = []
            for i in self.copied:
                target = self.targets[i]
                raw = target.detach().clone()
                target.copy_(self.tensors[i])
                self.saved.append((raw, target._version))

    def swap_out(self) -> None:
        """Give the trained weights back; copied-in entries edited meanwhile keep the edit."""
        assert self.saved is not None
        with torch.no_grad():
            for i in self.exchanged:
                _exchange(self.targets[i], self.tensors[i])
            for i, (raw, version) in zip(self.copied, self.saved, strict=True):
                target = self.targets[i]
                if target._version != version:
                    self.tensors[i].copy_(target)
                target.copy_(raw)
        self.saved = None

    def current(self) -> list[torch.Tensor]:
        """The tensors holding the average now (the model's own while exchanged in)."""
        if self.stale:
            self.refresh()
        if self.saved is None:
            return self.tensors
        current = list(self.tensors)
        for i in self.exchanged:
            current[i] = self.targets[i].detach()
        return current

    def raw_state(self) -> dict[str, torch.Tensor]:
        """While swapped in: every state-dict key to the tensor holding the trained value."""
        assert self.saved is not None
        raw = {i: self.tensors[i] for i in self.exchanged}
        raw.update({i: saved for i, (saved, _) in zip(self.copied, self.saved, strict=True)})
        return {key: raw[i] for key, i in self.slots.items()}

    def export(self) -> dict[str, Any]:
        """The average as ``model.state_dict()`` would hold it: same keys, same dtypes."""
        state = self.model.state_dict()
        current = self.current()
        for key, i in self.slots.items():
            state[key] = current[i].to(self.targets[i].dtype)
        return state

    def exact(self) -> dict[str, torch.Tensor]:
        """Entries whose average is wider than the model's dtype, as kept (for resume)."""
        current = self.current()
        return {
            key: current[i]
            for i, key in enumerate(self.keys)
            if current[i].dtype != self.targets[i].dtype
        }

    def load(self, state: dict[str, Any]) -> None:
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
                if value.shape != current[i].shape:
                    raise CheckpointMismatchError(
                        f"plugins.ema: saved average of {key!r} has shape {tuple(value.shape)}, "
                        f"the model's is {tuple(current[i].shape)}"
                    )
                current[i].copy_(value)
        self.stale = False


def _exchange(target: torch.Tensor, tensor: torch.Tensor) -> None:
    """Swap the storage behind two tensors of one dtype and device; both objects stay."""
    raw = target.data
    target.data = tensor.data
    tensor.data = raw

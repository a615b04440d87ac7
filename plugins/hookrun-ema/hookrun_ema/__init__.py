"""Exponential moving average (EMA) of a model's weights.

After every ``update_interval``-th optimizer step the average moves towards the new weights,
``ema = d * ema + (1 - d) * weights`` (so gradient accumulation needs no setting of its own).
With several optimizers it follows the one its ``optimizer`` setting names and averages that
optimizer's parameters; the others follow the trained model.
It is kept in float32 (float64 for float64 weights): a bf16 average at decay 0.9999 rounds
most updates away and stalls. Updates are a few ``torch._foreach_*`` calls with a
Python-float decay, so they never wait for the device.
Validation and test run with the average swapped into the model by exchanging tensor storage
(no copy), and the trained weights are given back afterwards, also when evaluation raises.
Swaps go through the model's ``hookrun.swap_stack``, so several averages (a subclass
registered under another name) nest: each is swapped out in reverse order of swapping in.
Checkpoints hold the average as a state dict that loads straight into the model.
Under ``strategy: fsdp`` each rank averages its own shards of the parameters
(:mod:`hookrun_ema.shadow`) and a sharded checkpoint holds the average as shards too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field
from torch import nn

from hookrun import (
    ConfigError,
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    hookimpl,
    swap_stack,
)
from hookrun_ema.shadow import Shadow, shadow_dtype

__all__ = ["EMA", "EMASettings", "Shadow", "shadow_dtype"]


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
    optimizer: str | None = Field(
        None,
        description="The optimizer whose steps the average follows, by its name in "
        "`runner.optimizers`; required when the run has several (a GAN's `generator`). Only "
        "that optimizer's parameters are averaged; the others are copied from the model at "
        "each update.",
    )
    evaluate: Literal["ema", "raw", "both"] = Field(
        "ema",
        description="Weights used by validation and test: `ema`, `raw` (the trained weights), or "
        "`both` (raw metrics plus `<plugin name>/<metric>` ones, `ema/accuracy` for instance, "
        "from a second pass with the average).",
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
        self.steps = 0  # steps seen of the optimizer followed
        self.follow: str | None = None  # that optimizer's name, once training starts
        self._pending: dict[str, Any] | None = None  # state loaded before the model was seen
        self._swaps = 0  # nesting depth of this plugin's swap-ins

    # -- training ------------------------------------------------------------------------

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        optimizers, wanted = runner.optimizers, self.settings.optimizer
        names = ", ".join(map(repr, optimizers))
        if wanted is None and len(optimizers) > 1:
            raise ConfigError(
                f"plugins.ema.optimizer: this run has several optimizers ({names}); name the "
                "one whose steps the average follows"
            )
        if wanted is not None and wanted not in optimizers:
            raise ConfigError(
                f"plugins.ema.optimizer: {wanted!r} is not an optimizer of this run ({names})"
            )
        self.follow = wanted or next(iter(optimizers))
        shadow = self._shadow_of(runner.unwrapped_model)
        if len(optimizers) > 1:
            groups = optimizers[self.follow].param_groups
            shadow.average_only({id(p) for group in groups for p in group["params"]})

    @hookimpl
    def after_optimizer_step(self, runner: RunnerProtocol, optimizer_name: str) -> None:
        shadow, settings = self.shadow, self.settings
        assert shadow is not None
        if optimizer_name != self.follow:
            return
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
        return {self.name: self.swapped_in}

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The average in the model's tensors for the ``with`` block, then what the model held
        before (the trained weights, or averages swapped in by evaluation). Edits made to the
        model inside the block (a BatchNorm statistics pass) stay in the average. When the
        average is swapped in already (validation), swaps made after it step aside."""
        assert self.shadow is not None
        stack = swap_stack(self.shadow.model)
        if self.shadow in stack:
            with stack.exposed(self.shadow):
                yield
            return
        stack.push(self.shadow)
        try:
            yield
        finally:
            stack.remove(self.shadow)

    def _add_ema_metrics(
        self, runner: RunnerProtocol, metrics: dict[str, float], loader: Any, mode: str
    ) -> None:
        self._shadow_of(runner.unwrapped_model)
        with self.swapped_in():
            ema_metrics = runner.evaluate(loader, mode)
        metrics.update({f"{self.name}/{k}": v for k, v in ema_metrics.items()})

    def _swap_in(self, model: nn.Module) -> None:
        """The average into the model's tensors, on top of the model's swap stack. Under DDP
        the core gives every rank rank 0's buffers after the ``before_val``/``before_test``
        hooks, so all ranks evaluate (and save) one average."""
        shadow = self._shadow_of(model)
        if self._swaps == 0:
            swap_stack(shadow.model).push(shadow)
        self._swaps += 1

    def _swap_out(self) -> None:
        """The average out of the model, from wherever it sits in the swap stack: another
        plugin's average swapped in after it stays in."""
        if self._swaps == 0:
            return
        self._swaps -= 1
        if self._swaps == 0:
            assert self.shadow is not None
            swap_stack(self.shadow.model).remove(self.shadow)

    # -- checkpoints ---------------------------------------------------------------------

    @hookimpl
    def before_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint taken during evaluation (a best-metric save) must still hold the
        trained weights as its model, not the average swapped into it."""
        if self.shadow is not None and self.shadow in swap_stack(self.shadow.model):
            checkpoint["model"].update(self.shadow.raw_state())

    @classmethod
    def export_weights(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """The average in a checkpoint's EMA state: its ``model`` entry (see
        :meth:`state_dict`), what ``hookrun export --ema`` writes."""
        model = state.get("model")
        return dict(model) if isinstance(model, dict) else None

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
        self.steps = int(state["steps"])

    def _shadow_of(self, model: nn.Module) -> Shadow:
        """The average, built from ``model`` on first use (and filled from a loaded state)."""
        if self.shadow is None:
            self.shadow = Shadow(model, self.settings.buffers == "average", self.settings.device)
            if self._pending is not None:
                state, self._pending = self._pending, None
                self.load_state_dict(state)
        return self.shadow

"""hookrun-nan-guard: a non-finite loss or gradient never reaches the weights.

The check runs in ``before_optimizer_step`` (after AMP unscaling, before clipping and the
step): GradScaler's fused inf check (``torch._amp_foreach_non_finite_check_and_unscale_``
with a scale of 1.0) over every gradient and the losses of the accumulation group gives one
flag on the device. Returning ``False`` skips the step (the core zeroes the gradients); the
tensors are named one by one only when a step is bad. Under ``amp: fp16`` GradScaler's
own inf check (made by ``unscale_``) is read instead of computing a second one.

A skip decision needs the flag on the host: with ``check_every: 1`` (default) that is one
host read per optimizer step, the same one GradScaler makes. ``check_every: N`` keeps the
flags on the device and reads them every N steps only; a bad step is then found late, after
it reached the weights, and the run fails (nothing is left to skip). Whatever the mode, no
checkpoint is written while one of its tensors is not finite (``before_save_checkpoint``).

Under ``strategy: fsdp`` each rank holds only its shards of the gradients and weights (their
local tensors are checked), so the ranks agree on the flag with one scalar all-reduce where it
is read (every step with ``check_every: 1``), and on a checkpoint's finiteness at each save.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import torch
from pydantic import Field

from hookrun import (
    Plugin,
    PluginSettings,
    Priority,
    RunnerProtocol,
    all_reduce_max,
    any_rank,
    hookimpl,
    local_shard,
)

__all__ = ["NanGuard", "NanGuardSettings", "NonFiniteError"]

SHOWN = 3  # tensors named in a message


class NanGuardSettings(PluginSettings):
    """Settings of the ``nan_guard`` plugin."""

    action: Literal["skip", "stop", "raise"] = Field(
        "skip",
        description="What a non-finite step does: `skip` leaves the weights as they are and "
        "goes on; `stop` skips it and ends training (`stop_training`); `raise` skips it and "
        "fails the run (exit 1) at the end of that iteration, naming it and the first "
        "non-finite tensors.",
    )
    max_consecutive: int | None = Field(
        10,
        ge=0,
        description="With `action: skip`, how many non-finite steps in a row are skipped; "
        "the next one in the same row does what `escalate` says. `null`: skip forever.",
    )
    escalate: Literal["stop", "raise"] = Field(
        "stop",
        description="What the step after `max_consecutive` skipped ones in a row does: "
        "`stop` (skip it and end training) or `raise`.",
    )
    check_every: int = Field(
        1,
        ge=1,
        description="Read the check on the host every this many optimizer steps. 1: every "
        "step can be skipped (one host read per step on a GPU). N > 1: no host read in "
        "between; a non-finite step found late has reached the weights and fails the run. "
        "No effect under `amp: fp16` (GradScaler reads its flag every step anyway).",
    )
    check_loss: bool = Field(
        True,
        description="Also check the losses back-propagated since the last step "
        "(`before_backward`). Single-process runs only: under DDP only the all-reduced "
        "gradients are checked, so every rank takes the same decision.",
    )


DeviceDtype = tuple[torch.device, torch.dtype]  # GradScaler's grouping of the gradients


class NonFiniteError(RuntimeError):
    """A non-finite step the guard may not skip, or a checkpoint it refuses to write."""


class NanGuard(Plugin[NanGuardSettings]):
    """Checks every optimizer step's gradients (and losses) and skips, stops or raises."""

    name = "nan_guard"
    Settings = NanGuardSettings
    priority = Priority.HIGH  # sees the gradients before lower-priority plugins edit them
    enabled_by_default = False

    def __init__(self, settings: NanGuardSettings | None = None) -> None:
        super().__init__(settings)
        self.skipped = 0
        self.nonfinite = 0  # steps found non-finite (host count, up to the last read)
        self.consecutive = 0
        self.losses: list[torch.Tensor] = []
        self.pending: torch.Tensor | None = None  # check_every > 1: bad steps since last read
        self.pending_since = 0  # the iteration of the first step in ``pending``
        # per optimizer name: its parameters by name, and grouped by device and dtype
        self.params: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self.groups: dict[str, list[tuple[DeviceDtype, list[torch.Tensor]]]] = {}
        self.several = False  # messages name the optimizer
        self.failure: str | None = None  # raised at the end of the iteration whose step it skipped
        self.ones: dict[torch.device, torch.Tensor] = {}  # the check's scale, 1.0, per device

    def unused_hooks(self, runner: RunnerProtocol) -> set[str]:
        """The loss is only collected where it is part of the decision; ``after_train_iter``
        only raises."""
        s = self.settings
        unused = set() if self.checks_loss(runner) else {"before_backward"}
        escalates = s.action == "skip" and s.max_consecutive is not None
        if s.action != "raise" and not (escalates and s.escalate == "raise"):
            unused.add("after_train_iter")
        return unused

    def checks_loss(self, runner: RunnerProtocol) -> bool:
        return self.settings.check_loss and runner.world_size == 1 and runner.scaler is None

    @hookimpl
    def before_train(self, runner: RunnerProtocol) -> None:
        """Name every parameter each optimizer updates; put the counters in the report."""
        names = {id(p): n for n, p in runner.unwrapped_model.named_parameters()}
        self.several = len(runner.optimizers) > 1
        for name, optimizer in runner.optimizers.items():
            params = self.params[name] = [
                (names.get(id(p), f"param_groups[{g}][{i}]"), p)
                for g, group in enumerate(optimizer.param_groups)
                for i, p in enumerate(group["params"])
            ]
            groups: dict[DeviceDtype, list[torch.Tensor]] = {}
            for _, p in params:
                groups.setdefault((p.device, p.dtype), []).append(p)
            self.groups[name] = list(groups.items())
        self.losses.clear()
        runner.scalars.gauge("train/skipped_steps", Count(lambda: self.skipped))
        runner.scalars.gauge("train/nonfinite_grads", Count(self.nonfinite_so_far))

    @hookimpl
    def before_backward(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach())

    @hookimpl
    def before_optimizer_step(
        self, runner: RunnerProtocol, optimizer: Any, optimizer_name: str
    ) -> bool | None:
        try:
            scaler = runner.scaler
            if scaler is not None:  # GradScaler's unscale_ already looked for infs: reuse it
                found_by_scaler = bool(scaler_found_inf(scaler, optimizer))
                return self.decide(runner, optimizer_name, found_by_scaler)
            found = self.found_inf(runner, optimizer_name)
            if self.settings.check_every == 1:
                if runner.strategy == "fsdp":  # each rank checked its own gradient shards
                    found = all_reduce_max(found)
                return self.decide(runner, optimizer_name, bool(found))  # the one host read
            if self.pending is None:
                self.pending, self.pending_since = found, runner.iter
            else:
                self.pending += found
            # this is the run's n-th optimizer step (the core counts it once it is taken)
            steps = sum(runner.position.optimizer_steps.values()) + 1
            if steps % self.settings.check_every == 0:
                self.read_pending(runner)
            return None
        finally:
            self.losses.clear()

    @hookimpl
    def after_train_iter(self) -> None:
        """Fail the run at the end of the iteration whose step was skipped: the position
        then counts it, so an emergency checkpoint is consistent, and finite."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise NonFiniteError(failure)

    @hookimpl
    def before_save_checkpoint(self, runner: RunnerProtocol, checkpoint: dict[str, Any]) -> None:
        """Refuse to write a checkpoint holding a NaN or an infinity (one fused check per
        save): ``--resume auto`` then finds the last finite one."""
        if self.pending is not None:
            self.read_pending(runner)
        bad = non_finite_names(dict(floating(checkpoint)))
        if runner.strategy == "fsdp" and any_rank(bool(bad)) and not bad:
            bad = ["tensors of another rank's shards"]  # every rank refuses the save
        if bad:
            raise NonFiniteError(
                f"nan_guard: refusing to save a checkpoint at iteration {runner.iter}: "
                f"not finite: {', '.join(bad)}"
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "skipped": self.skipped,
            "nonfinite": self.nonfinite,
            "consecutive": self.consecutive,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("skipped", "nonfinite", "consecutive"):
            setattr(self, key, int(state[key]))

    # -- the decision --------------------------------------------------------------------

    def found_inf(self, runner: RunnerProtocol, name: str) -> torch.Tensor:
        """1.0 when a gradient or a loss of this step holds a NaN or an infinity, else 0.0,
        left on the device: GradScaler's fused check, one kernel per device and dtype as
        GradScaler groups them. It multiplies by 1.0 in place, which changes no value (the
        losses are detached, and backward has already freed their graphs)."""
        groups = {
            key: [local_shard(p.grad) for p in params if p.grad is not None]
            for key, params in self.groups[name]
        }
        if self.checks_loss(runner):
            for loss in self.losses:
                groups.setdefault((loss.device, loss.dtype), []).append(loss)
        found = [self.check(group, device) for (device, _), group in groups.items() if group]
        if not found:
            return torch.zeros(())
        if len(found) == 1:
            return found[0]
        device = found[0].device
        return torch.stack([f.to(device) for f in found]).amax()

    def check(self, tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """GradScaler's inf check over ``tensors`` (all on ``device``): 1.0 if any holds a
        NaN or an infinity. One kernel, where a norm per tensor costs a reduction each."""
        found = torch.zeros((), device=device)
        one = self.ones.get(device)
        if one is None:
            one = self.ones[device] = torch.ones((), device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, one)
        return found

    def decide(self, runner: RunnerProtocol, name: str, bad: bool) -> bool | None:
        """Skip (``False``), stop or raise for a bad step; reset the run of bad steps."""
        if not bad:
            self.consecutive = 0
            return None
        self.nonfinite += 1
        self.consecutive += 1
        s = self.settings
        action: str = s.action
        limit = s.max_consecutive
        if action == "skip" and limit is not None and self.consecutive > limit:
            action = s.escalate
        what = self.describe(runner, name)
        self.skipped += 1
        step = f"non-finite step{f' of optimizer {name!r}' if self.several else ''}"
        if action == "raise":  # after the iteration: an emergency save then holds its end
            self.failure = (
                f"nan_guard: {step} at iteration {runner.iter} "
                f"({self.consecutive} in a row): {what}"
            )
        if action == "stop":
            runner.stop_training = True
            runner.info(
                f"nan_guard: {step} at iteration {runner.iter} ({self.consecutive} "
                f"in a row) skipped; stopping: {what}"
            )
        return False

    def describe(self, runner: RunnerProtocol, name: str) -> str:
        """The first non-finite gradients (and losses) by name: looked for one by one, on
        the failure path only."""
        named = {f"grad of {n}": p.grad for n, p in self.params[name] if p.grad is not None}
        if self.checks_loss(runner):
            named.update({f"loss[{i}]": loss.reshape(1) for i, loss in enumerate(self.losses)})
        bad = non_finite_names(named)
        if bad:
            return f"not finite: {', '.join(bad)}"
        if runner.strategy == "fsdp":
            return "not finite in another rank's gradient shards"
        return "not finite (found by GradScaler)"

    def read_pending(self, runner: RunnerProtocol) -> None:
        """``check_every > 1``: read the bad steps since the last read (one host read); any
        bad one has reached the weights already, so the run fails."""
        pending, self.pending = self.pending, None
        if pending is not None and runner.strategy == "fsdp":  # every rank's shards' flags
            pending = all_reduce_max(pending)
        count = round(float(pending)) if pending is not None else 0
        if not count:
            self.consecutive = 0
            return
        self.nonfinite += count
        weights = non_finite_names({n: p for params in self.params.values() for n, p in params})
        now = f"weights not finite: {', '.join(weights)}" if weights else "weights still finite"
        raise NonFiniteError(
            f"nan_guard: {count} non-finite step(s) between iterations {self.pending_since} and "
            f"{runner.iter}, found late (check_every: {self.settings.check_every}); {now}"
        )

    def nonfinite_so_far(self) -> int:
        """Bad steps, those not yet read by a ``check_every`` window included."""
        pending = round(float(self.pending)) if self.pending is not None else 0
        return self.nonfinite + pending


class Count:
    """A gauge whose value is read from the plugin when the core reports (no tensor kept)."""

    __slots__ = ("read",)

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def __float__(self) -> float:
        return float(self.read())


def scaler_found_inf(scaler: torch.amp.GradScaler, optimizer: Any) -> torch.Tensor:
    """The infs GradScaler's ``unscale_`` found for ``optimizer``, summed over devices
    (GradScaler keeps them per optimizer; it reads them again in ``step``)."""
    state = scaler._per_optimizer_states[id(optimizer)]
    found = list((state.get("found_inf_per_device") or {}).values())
    return torch.stack([f.to(found[0].device) for f in found]).sum() if found else torch.zeros(())


def floating(state: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor of a nested checkpoint, by ``/``-separated path."""
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() or state.is_complex():
            yield prefix.lstrip("/"), state
    elif isinstance(state, Mapping):
        for key, value in state.items():
            yield from floating(value, f"{prefix}/{key}")
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            yield from floating(value, f"{prefix}/{i}")


def non_finite_names(named: Mapping[str, torch.Tensor]) -> list[str]:
    """The first names whose tensor holds a NaN or an infinity: one fused check and one host
    read per device."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, value in named.items():
        value = local_shard(value)  # a DTensor: this rank's shard
        if value.numel():
            by_device.setdefault(value.device, []).append((name, value.detach()))
    bad: list[str] = []
    for pairs in by_device.values():
        norms = torch._foreach_norm([value for _, value in pairs], math.inf)
        flags = torch.stack([norm.float() for norm in norms]).isfinite().tolist()
        bad += [name for (name, _), ok in zip(pairs, flags, strict=True) if not ok]
    return bad[:SHOWN] + ([f"{len(bad) - SHOWN} more"] if len(bad) > SHOWN else [])

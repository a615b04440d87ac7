"""The three step conventions: how a batch becomes losses (training) or metric values
(evaluation). docs/training-step.md explains each.

1. The model defines ``training_step(batch)`` returning a loss tensor, a dict holding
   ``"loss"`` or an object with ``.loss``, and ``validation_step(batch)`` returning a dict
   of per-batch metric values. ``training_step(batch, optim)`` (a second parameter) is
   manual optimization: it calls ``optim.backward`` and ``optim.step`` itself.
2. A ``criterion``: the model is called on ``inputs`` of an ``(inputs, targets)`` batch,
   ``criterion(outputs, targets)`` is the loss, ``metrics={"name": fn(outputs, targets)}``.
3. Neither: the model computes its own loss (Hugging Face style): ``model(**batch)`` for a
   mapping batch, ``model(batch)`` otherwise; the output's ``loss`` (key or attribute) is
   the loss, and metrics receive ``(outputs, batch)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hookrun.distributed.collectives import all_reduce_sum
from hookrun.errors import HookrunError

OWN_LOSS = "the model computes its loss: model(**batch) for a mapping batch, else model(batch)"
CRITERION = (
    "criterion: batches are (inputs, targets) and the loss is criterion(model(inputs), targets)"
)
WAY_OUT = "define training_step(batch) on the model, or pass criterion=..."
CRITERION_WAY_OUT = (
    "make forward return what the criterion takes, or define training_step(batch) on the model"
)
#: What a call of a convention raises when a value is of a kind it cannot take: a TypeError,
#: or an AttributeError, KeyError or IndexError on a value that is not a tensor (a dict
#: given where a tensor goes, a mapping indexed as a sequence: ``KeyError: 0``).
MISFITS = (TypeError, AttributeError, KeyError, IndexError)
_NOT_YET = object()  # the outputs of a model call that raised


class StepError(HookrunError):
    """A batch or an output that does not fit the step convention in use: one line naming
    the convention and the way out. Raised at the step; nothing is saved for it."""


def is_manual(step: Callable[..., Any] | None) -> bool:
    """Whether ``training_step`` takes the step object (``training_step(batch, optim)``)."""
    if step is None:
        return False
    params = [
        p
        for p in inspect.signature(step).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(params) >= 2


def convention_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    misfit: Callable[[], str],
    way_out: str,
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """``fn(*args, **kwargs)``, one call a step convention makes (the model on the batch or
    its inputs, the criterion or a metric on the outputs). One of :data:`MISFITS` raised
    there is the batch or output not fitting the convention: a :class:`StepError` line of
    ``misfit()`` (what could not take what, and the convention), the exception and
    ``way_out``. Every step convention goes through here, in every command."""
    kwargs = kwargs or {}
    try:
        return fn(*args, **kwargs)
    except MISFITS as exc:
        if _is_bug(exc, (*args, *kwargs.values())):
            raise
        raise StepError(f"{misfit()}: {type(exc).__name__}: {exc}; {way_out}") from None


def _is_bug(exc: BaseException, values: tuple[Any, ...]) -> bool:
    """Whether ``exc``, raised by a convention's call on ``values``, is a bug of the code
    called (not a TypeError, and every value a tensor: the right kinds), to be raised with
    its own traceback rather than as a :class:`StepError` line."""
    return not isinstance(exc, TypeError) and all(isinstance(v, torch.Tensor) for v in values)


def training_losses(
    model: nn.Module,
    module: nn.Module,
    step: Callable[..., Any] | None,
    criterion: Any,
    batch: Any,
) -> dict[str, Any]:
    """Losses of one batch as a dict with ``"loss"`` first (``num_items`` too when the step
    reports it).

    ``model`` may be a DDP wrapper of ``module``; ``step`` is the module's ``training_step``
    (or None), called through the wrapper so DDP's gradient hooks fire.
    """
    if step is not None:
        out = step(batch) if model is module else _through_wrapper(model, module, step, batch)
        losses = step_outputs(out, f"{type(module).__name__}.training_step", required=True)
    elif criterion is not None:
        losses = {"loss": criterion_loss(model, module, criterion, batch)[1]}
    else:
        losses = model_outputs(own_loss_call(model, module, batch), module)
    loss = losses["loss"]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise StepError(
            f"the loss of {type(module).__name__} is {kind(loss)}: back-propagation needs "
            "one value (a tensor of one element); reduce it, e.g. loss.mean()"
        )
    return losses


def criterion_loss(
    model: nn.Module, module: nn.Module, criterion: Any, batch: Any
) -> tuple[Any, Any]:
    """``(outputs, loss)`` of a batch under the criterion convention; inputs the model
    cannot take, or outputs the criterion cannot take, are one line (as
    :func:`convention_call`). Both calls share one ``try``: the line is built only when one
    fails, so the step pays nothing for it."""
    inputs, targets = criterion_pair(batch)
    outputs: Any = _NOT_YET
    try:
        outputs = model(inputs)
        return outputs, criterion(outputs, targets)
    except MISFITS as exc:
        if outputs is _NOT_YET:
            values: tuple[Any, ...] = (inputs,)
            line = f"{type(module).__name__} cannot take the inputs, {kind(inputs)} ({CRITERION})"
            way_out = (
                "define training_step(batch) on the model, or drop criterion to let the model "
                "compute its loss"
            )
        else:
            values = (outputs, targets)
            line = (
                f"{_name(criterion)} cannot take {type(module).__name__}'s output, "
                f"{kind(outputs)}, and the targets, {kind(targets)} ({CRITERION})"
            )
            way_out = CRITERION_WAY_OUT
        if _is_bug(exc, values):
            raise
        raise StepError(f"{line}: {type(exc).__name__}: {exc}; {way_out}") from None


def _metric(name: str, fn: Callable[..., Any], outputs: Any, second: Any, what: str) -> Any:
    """A metric's value: ``fn(outputs, targets)`` under a criterion, else ``fn(outputs,
    batch)``; values it cannot take are one line (:func:`convention_call`)."""
    return convention_call(
        fn,
        (outputs, second),
        lambda: (
            f"metric {name!r} cannot take the outputs, {kind(outputs)}, and {what}, {kind(second)}"
        ),
        f"make metric {name!r} take them, or define validation_step(batch) on the model",
    )


def own_loss_call(model: nn.Module, module: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` or ``model(batch)``; a model that cannot take the batch so is one
    line naming the convention and the way out (:func:`convention_call`)."""
    mapping = isinstance(batch, Mapping)
    return convention_call(
        model,
        () if mapping else (batch,),
        lambda: f"{type(module).__name__} cannot take {kind(batch)} ({OWN_LOSS})",
        WAY_OUT,
        batch if mapping else None,
    )


def step_outputs(out: Any, where: str, required: bool) -> dict[str, Any]:
    """What a ``training_step`` returned as a dict: a tensor is the loss, a mapping is kept
    as it is, an object with ``.loss`` gives its loss (and ``num_items``). ``required``: a
    loss must be there (automatic optimization); manual optimization may return None."""
    if isinstance(out, torch.Tensor):
        return {"loss": out}
    if isinstance(out, Mapping) and "loss" in out:
        return {"loss": out["loss"], **{k: v for k, v in out.items() if k != "loss"}}
    if not isinstance(out, Mapping) and getattr(out, "loss", None) is not None:
        return _own_loss(out, out.loss)
    if out is None and not required:
        return {}
    if isinstance(out, Mapping) and not required:
        return dict(out)
    raise StepError(
        f"{where} returned {kind(out)}: training_step must return a loss tensor, a dict with "
        "'loss' or an object with .loss"
    )


def model_outputs(out: Any, module: nn.Module) -> dict[str, Any]:
    """The loss of a model that computes its own: ``out["loss"]`` or ``out.loss``."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise StepError(
            f"{type(module).__name__} returned {kind(out)} with no 'loss' ({OWN_LOSS}); {WAY_OUT}"
        )
    return _own_loss(out, loss)


def _own_loss(out: Any, loss: torch.Tensor) -> dict[str, Any]:
    """The loss of a model's own output, with the items it averaged over when it says so;
    its other fields (logits, caches) are not losses and are not logged."""
    items = out.get("num_items") if isinstance(out, Mapping) else getattr(out, "num_items", None)
    return {"loss": loss} if items is None else {"loss": loss, "num_items": items}


def criterion_pair(batch: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` of a batch under the criterion convention."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise StepError(
        f"{CRITERION}; got {kind(batch)}: drop criterion to let the model compute its loss "
        "(model(**batch) for a mapping), or define training_step(batch) on the model"
    )


def _name(fn: Any) -> str:
    """A criterion's or metric's name: its function's, else its class's (``MSELoss``)."""
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def kind(value: Any) -> str:
    """What a value is, for a line that says a convention cannot take it: its type, with a
    mapping's first keys, a tensor's shape or a sequence's length."""
    if isinstance(value, Mapping):
        keys = ", ".join(map(repr, list(value)[:5]))
        return f"a {type(value).__name__} with keys [{keys}]"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _through_wrapper(
    model: nn.Module, module: nn.Module, step: Callable[..., Any], batch: Any
) -> Any:
    """Run ``training_step`` so DDP sees a forward: the wrapper's call of the module runs the
    step, and the step's own calls ``self(x)`` (compiled under ``runner.compile``) reach the
    module's forward again."""
    own = vars(module).get("forward")  # an instance's own forward, else the class's

    def put_back() -> None:
        if own is None:
            vars(module).pop("forward", None)
        else:
            module.forward = own

    def routed(*args: Any, **kwargs: Any) -> Any:
        put_back()
        return step(*args, **kwargs)

    module.forward = routed
    try:
        return model(batch)
    finally:
        put_back()


def evaluation_values(
    module: nn.Module,
    criterion: Any,
    metrics: Mapping[str, Callable[..., Any]],
    batch: Any,
    mode: str,
) -> dict[str, Any]:
    """Per-batch metric values (means over the batch) for validation or test."""
    step = getattr(module, f"{mode}_step", None) if mode == "test" else None
    step = step or getattr(module, "validation_step", None)
    if step is not None:
        values = step(batch)
        if not isinstance(values, Mapping):
            raise StepError(
                f"{type(module).__name__}.{step.__name__} must return a dict of metric values "
                f"(got {kind(values)})"
            )
        return dict(values)
    if criterion is not None:
        outputs, loss = criterion_loss(module, module, criterion, batch)
        second, what = criterion_pair(batch)[1], "targets"
    else:
        outputs = own_loss_call(module, module, batch)
        loss, second, what = model_outputs(outputs, module)["loss"], batch, "the batch"
    values = {"loss": loss}
    for name, fn in metrics.items():
        values[name] = _metric(name, fn, outputs, second, what)
    return values


class MetricMeans:
    """Sample-weighted sums of per-batch metric values, kept on the device until the end of
    the pass, then reduced over ranks and read to the host in one transfer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.count = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, values: Mapping[str, Any], n: int) -> None:
        for name, value in values.items():
            value = torch.as_tensor(value, device=self.device).detach().double().mean() * n
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.count += n

    def result(self) -> dict[str, float]:
        names = list(self.sums)
        packed = all_reduce_sum(torch.stack([*(self.sums[n] for n in names), self.count]))
        values = packed.tolist()
        total = values[-1] or 1.0
        return {name: value / total for name, value in zip(names, values[:-1], strict=True)}

"""The ``scheduler:`` section of a config: checked before any work and built from the
optimizers and the run's length.

The schedule is torch's own: an optional ``LinearLR`` warm-up followed by the main scheduler
through ``SequentialLR``; lengths given as ``auto`` are the run's, in optimizer steps or
epochs. The key is one section or a mapping of optimizer names to sections, named as the
``optimizer:`` key (:mod:`hookrun.config.optimizers`) names them. What the learning rate is
at every iteration, computed without training, is :mod:`hookrun.config.schedule`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from hookrun.config.keywords import (
    find_class,
    keyword_errors,
    non_finite_errors,
    one_line,
    quoted_number_errors,
)
from hookrun.config.optimizers import (
    OptimizerConfig,
    named_sections,
    optimizer_named,
    optimizer_sections,
    shape_discriminator,
)
from hookrun.engine.position import DEFAULT_MAX_EPOCHS, groups_closed
from hookrun.errors import ConfigError
from hookrun.hooks.discovery import did_you_mean

if TYPE_CHECKING:
    import torch

#: Keywords of the main scheduler that ``auto`` fills with the run's length (after warm-up).
AUTO_KEYS = ("T_max", "total_iters", "total_steps", "T_0")


class Warmup(BaseModel):
    """A linear warm-up (``torch.optim.lr_scheduler.LinearLR``) before the main scheduler."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    iters: int | None = Field(None, ge=1, description="Warm-up length in iterations.")
    epochs: int | None = Field(None, ge=1, description="Warm-up length in epochs.")
    start_factor: float = Field(
        0.001, gt=0, le=1, description="The first learning rate as a fraction of the base."
    )

    @model_validator(mode="after")
    def _one_length(self) -> Warmup:
        if (self.iters is None) == (self.epochs is None):
            raise ValueError("give iters or epochs, one of them")
        return self


class SchedulerConfig(BaseModel):
    """The ``scheduler:`` section."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    main: dict[str, Any] = Field(
        description="The main scheduler: `type` (a `torch.optim.lr_scheduler` class or a "
        "dotted path) and its keywords; `T_max`, `total_iters`, `total_steps` or `T_0` "
        "given as `auto` are the run's length after the warm-up."
    )
    warmup: Warmup | None = Field(None, description="An optional linear warm-up.")
    interval: Literal["iter", "epoch"] | None = Field(
        None,
        description="Step the schedule after every optimizer step (`iter`) or epoch "
        "(`epoch`); default: `runner.scheduler_interval`.",
    )


def scheduler_named(section: Any) -> bool:
    """Whether a ``scheduler:`` section is a mapping of optimizer names to sections: every
    value a mapping, and no key one of a section's (``main``, ``warmup``, ``interval``) unless
    every value is a section itself (an optimizer may be named ``main``)."""
    if not optimizer_named(section):
        return False
    keys = set(section) & set(SchedulerConfig.model_fields)
    return not keys or all("main" in v for v in section.values())


def scheduler_sections(section: Any) -> list[tuple[str | None, str, Any]]:
    """The sections of the ``scheduler:`` key (see ``named_sections``)."""
    return named_sections("scheduler", section, scheduler_named(section))


SchedulerSections = Annotated[
    Annotated[SchedulerConfig, Tag("one")] | Annotated[dict[str, SchedulerConfig], Tag("named")],
    Discriminator(shape_discriminator(scheduler_named)),
]
"""The ``scheduler:`` key: one section or a mapping of optimizer names to sections."""


# -- checking ---------------------------------------------------------------------------------


def scheduler_errors(section: Any) -> list[str]:
    """Problems of the ``scheduler:`` key found without a model, each section's: the main
    class, its keywords against the signature, ``auto`` only where a length goes."""
    return [e for _, where, one in scheduler_sections(section) for e in _scheduler(where, one)]


def _scheduler(where: str, section: Any) -> list[str]:
    main = section.get("main") if isinstance(section, Mapping) else None
    if not isinstance(main, Mapping):
        return []
    kind = main.get("type")
    if not isinstance(kind, str):
        return [f"{where}.main.type: required: a torch.optim.lr_scheduler class or a dotted path"]
    try:
        cls = find_class(kind, "torch.optim.lr_scheduler")
    except ConfigError as exc:
        return [f"{where}.main.type: {line}" for line in exc.lines]
    keywords = {k: v for k, v in main.items() if k != "type"}
    errors = keyword_errors(f"{where}.main", cls, keywords, skip=("optimizer",))
    errors += quoted_number_errors(f"{where}.main", keywords)
    errors += non_finite_errors(f"{where}.main", keywords)
    errors += [
        f"{where}.main.{key}: `auto` only fills {', '.join(AUTO_KEYS)}"
        for key, value in keywords.items()
        if value == "auto" and key not in AUTO_KEYS
    ]
    return errors


# -- building ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunLength:
    """How long a run is, in the units a schedule steps in."""

    epochs: int
    optimizer_steps_per_epoch: int
    optimizer_steps: int
    max_iters: int | None = None  # the run's own limit, when it is one of iterations

    def steps(self, interval: str) -> int:
        return self.optimizer_steps if interval == "iter" else self.epochs


def run_length(
    batches_per_epoch: int, max_epochs: int | None, max_iters: int | None, grad_accum: int
) -> RunLength:
    """Optimizer steps of a run: groups of ``grad_accum`` batches per epoch, an epoch's last
    batch closing a group (a run ending mid-epoch steps only at complete groups)."""
    per_epoch = groups_closed(1, 0, batches_per_epoch, grad_accum)
    if max_iters is None:
        epochs = max_epochs or DEFAULT_MAX_EPOCHS
        return RunLength(epochs, per_epoch, epochs * per_epoch)
    full, rest = divmod(max_iters, batches_per_epoch)
    steps = groups_closed(full, rest, batches_per_epoch, grad_accum)
    return RunLength(full + (1 if rest else 0), per_epoch, steps, max_iters)


def build_schedulers(
    optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
    section: Mapping[str, Any],
    length: RunLength,
    interval: str,
) -> Any:
    """The schedule the ``scheduler:`` key declares over ``optimizer``, or the schedules by
    optimizer name; each named schedule's ``auto`` lengths are the run's optimizer steps, as
    automatic optimization steps every optimizer at each accumulation boundary."""
    if not isinstance(optimizer, Mapping):
        errors = target_errors(section, None)
        if errors:
            raise ConfigError(errors)
        return build_scheduler(optimizer, section, length, interval)
    errors = target_errors(section, list(optimizer))
    if errors:
        raise ConfigError(errors)
    built = {}
    for name, where, one in scheduler_sections(section):
        try:
            built[str(name)] = build_scheduler(optimizer[str(name)], one, length, interval, where)
        except ConfigError as exc:
            errors += exc.lines
    if errors:
        raise ConfigError(errors)
    return built


def target_errors(scheduler: Any, optimizers: list[str] | None) -> list[str]:
    """A schedule per optimizer name: the ``scheduler:`` key named as the optimizers are
    (``optimizers``: their names, None when there is one), each name an optimizer's."""
    named = scheduler_named(scheduler)
    if optimizers is None:
        if not named:
            return []
        return [
            f"scheduler: names schedules ({', '.join(map(str, scheduler))}) for one optimizer; "
            "name the optimizers too (optimizer: {NAME: {type: ..., params: SUBMODULE}})"
        ]
    if not named:
        return [
            f"scheduler: one schedule for the optimizers {', '.join(optimizers)}; give each "
            f"its own by name (scheduler: {{{optimizers[0]}: {{main: ...}}}})"
        ]
    return [
        f"scheduler.{name}: no optimizer named {name!r}{did_you_mean(str(name), optimizers)} "
        f"(optimizers: {', '.join(optimizers)})"
        for name in scheduler
        if str(name) not in optimizers
    ]


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    section: Mapping[str, Any],
    length: RunLength,
    interval: str,
    where: str = "scheduler",
) -> Any:
    """The schedule one section declares: warm-up (``LinearLR``) then the main scheduler,
    composed with ``SequentialLR``; ``auto`` lengths are filled from ``length``."""
    from torch.optim.lr_scheduler import LinearLR, SequentialLR

    config = SchedulerConfig.model_validate(section)
    epochs = None if length.max_iters is not None else length.epochs
    problem = warmup_problem(config.warmup, interval, epochs, length.max_iters, where)
    if problem:
        raise ConfigError(problem)
    warm = warmup_steps(config.warmup, interval, length)
    total = length.steps(interval)
    if warm >= total:
        unit = "optimizer steps" if interval == "iter" else "epochs"
        raise ConfigError(
            f"{where}.warmup: {warm} warm-up steps leave nothing of the run's {total} {unit}"
        )
    main = build_main(optimizer, config.main, total - warm, where)
    if not warm:
        return main
    warmup = LinearLR(optimizer, start_factor=config.warmup.start_factor, total_iters=warm)  # type: ignore[union-attr]
    return SequentialLR(optimizer, [warmup, main], milestones=[warm])


def build_main(
    optimizer: torch.optim.Optimizer, main: Mapping[str, Any], auto: int, where: str = "scheduler"
) -> Any:
    """The main scheduler over ``optimizer``, ``auto`` lengths filled with ``auto``; torch's
    refusal of a value is one config line."""
    keywords = {k: (auto if v == "auto" else v) for k, v in main.items() if k != "type"}
    cls = find_class(str(main["type"]), "torch.optim.lr_scheduler")
    try:
        return cls(optimizer, **keywords)
    except Exception as exc:
        message = f"{where}.main: {cls.__name__} refuses these values: {one_line(exc)}"
        raise ConfigError(message) from None


def schedule_errors(
    section: Mapping[str, Any],
    runner: Mapping[str, Any],
    optimizer: Mapping[str, Any] | None,
) -> list[str]:
    """What :func:`build_schedulers` refuses that the config alone decides, for ``hookrun
    config validate``, with the same lines from the same checks: with a declared (and valid)
    ``optimizer:`` key, a schedule per optimizer name (:func:`target_errors`); each section's
    warm-up (:func:`warmup_problem`) and the main scheduler's values on a throwaway
    optimizer of its optimizer's class (:func:`build_main`)."""
    targets: dict[str | None, Any] = {}
    if optimizer is not None:
        targets = {name: one for name, _, one in optimizer_sections(optimizer)}
        names = None if None in targets else [str(name) for name in targets]
        errors = target_errors(section, names)
        if errors:
            return errors
    return [
        e
        for name, where, one in scheduler_sections(section)
        for e in _schedule(where, one, runner, targets.get(name))
    ]


def _schedule(
    where: str, section: Mapping[str, Any], runner: Mapping[str, Any], optimizer: Any
) -> list[str]:
    """One section's checks for :func:`schedule_errors`. The throwaway optimizer's groups are
    as many as the longest list among the keywords, so a per-group list passes here: whether
    it fits the model's groups, and the warm-up against a length in batches, the task tells."""
    config = SchedulerConfig.model_validate(section)
    interval = schedule_interval(section, runner)
    max_iters = runner.get("max_iters")
    epochs = None if max_iters is not None else runner.get("max_epochs") or DEFAULT_MAX_EPOCHS
    problem = warmup_problem(config.warmup, interval, epochs, max_iters, where)
    if problem:
        return [problem]
    if optimizer is None:
        return []  # the task's optimizer: its class and groups are the task's
    import torch

    lists = [len(v) for v in config.main.values() if isinstance(v, (list, tuple))]
    groups = [{"params": [torch.zeros(1, requires_grad=True)]} for _ in range(max(lists or [1]))]
    options = {k: v for k, v in optimizer.items() if k not in OptimizerConfig.model_fields}
    throwaway = find_class(str(optimizer["type"]), "torch.optim")(groups, **options)
    try:  # any length the run gives ``auto`` is at least 1, which torch's checks take alike
        build_main(throwaway, config.main, 1, where)
    except ConfigError as exc:
        return exc.lines
    return []


def warmup_problem(
    warmup: Warmup | None,
    interval: str,
    epochs: int | None,
    max_iters: int | None,
    where: str = "scheduler",
) -> str | None:
    """A warm-up in the wrong unit, or as long as the run where the config alone tells:
    ``epochs`` is the run's length when it is whole epochs, ``max_iters`` when it is
    iterations (optimizer steps are never more than iterations)."""
    if warmup is None:
        return None
    if warmup.iters is not None and interval == "epoch":
        return (
            f"{where}.warmup.iters: an epoch-wise schedule warms up in epochs "
            "(use warmup.epochs, or interval: iter)"
        )
    if warmup.epochs is not None and epochs is not None and warmup.epochs >= epochs:
        return (
            f"{where}.warmup.epochs: {warmup.epochs} warm-up epochs leave nothing of "
            f"the run's {epochs} epochs"
        )
    if warmup.iters is not None and max_iters is not None and warmup.iters >= max_iters:
        return (
            f"{where}.warmup.iters: {warmup.iters} warm-up iterations leave nothing of "
            f"the run's {max_iters} iterations"
        )
    return None


def warmup_steps(warmup: Warmup | None, interval: str, length: RunLength) -> int:
    """The warm-up's length in the schedule's steps (after :func:`warmup_problem`)."""
    if warmup is None:
        return 0
    if warmup.epochs is not None:
        return warmup.epochs * (length.optimizer_steps_per_epoch if interval == "iter" else 1)
    return int(warmup.iters or 0)


def schedule_interval(scheduler: Mapping[str, Any] | None, runner: Mapping[str, Any]) -> str:
    """The interval the declared schedules step at: their own (each section's, which agree),
    else the runner's."""
    own = [
        one.get("interval")
        for _, _, one in scheduler_sections(scheduler or {})
        if isinstance(one, Mapping)
    ]
    return str(next(filter(None, own), None) or runner.get("scheduler_interval") or "epoch")

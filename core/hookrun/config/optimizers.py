"""The ``optimizer:`` and ``scheduler:`` sections of a config: checked before any work, built
from the model and the run's length, and the learning rate over a run computed without
training (``hookrun schedule``).

The optimizer is any ``torch.optim`` class or a dotted path; its keywords are checked against
the class's signature and tried on a throwaway parameter, so torch's own range checks
(``Invalid learning rate``) surface as config errors. The schedule is torch's own: an
optional ``LinearLR`` warm-up followed by the main scheduler through ``SequentialLR``
(:mod:`hookrun.config.schedule` steps it without training).

Either section is one section or a mapping of names to sections (several optimizers, each
training the submodule its ``params:`` names, and a schedule per optimizer name); every
check and build below runs per section, its lines naming the section's path.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from hookrun.engine.position import DEFAULT_MAX_EPOCHS, groups_closed
from hookrun.errors import ConfigError
from hookrun.hooks.discovery import did_you_mean

if TYPE_CHECKING:
    import torch

#: Keywords of the main scheduler that ``auto`` fills with the run's length (after warm-up).
AUTO_KEYS = ("T_max", "total_iters", "total_steps", "T_0")


class ParamGroup(BaseModel):
    """Parameters whose names match ``params`` (a glob), with their own keywords."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    params: str = Field(
        description="Glob over parameter names (`head.*`, `*.bias`); the first group that "
        "matches a parameter takes it."
    )


class OptimizerConfig(BaseModel):
    """The ``optimizer:`` section; keys other than these are the class's keywords."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    type: str = Field(
        description="A `torch.optim` class name (`AdamW`, `SGD`) or a dotted path "
        "(`package.module.Class`)."
    )
    param_groups: list[ParamGroup] = Field(
        default_factory=list,
        description="Parameter groups by name pattern, each with its own keywords "
        "(`lr`, `weight_decay`, ...); parameters no group matches form the first group.",
    )
    no_decay: bool = Field(
        False,
        description="Give biases and normalisation weights (every parameter with fewer "
        "than 2 dimensions) `weight_decay: 0`.",
    )
    params: str | None = Field(
        None,
        min_length=1,
        description="The submodule this optimizer trains, by its dotted name (`generator`, "
        "`encoder.layers`); default: the whole model.",
    )


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


def optimizer_named(section: Any) -> bool:
    """Whether an ``optimizer:`` section is a mapping of names to sections: every value a
    mapping (one section has a ``type`` string)."""
    return (
        isinstance(section, Mapping)
        and bool(section)
        and all(isinstance(v, Mapping) for v in section.values())
    )


def scheduler_named(section: Any) -> bool:
    """Whether a ``scheduler:`` section is a mapping of optimizer names to sections: every
    value a mapping, and no key one of a section's (``main``, ``warmup``, ``interval``) unless
    every value is a section itself (an optimizer may be named ``main``)."""
    if not optimizer_named(section):
        return False
    keys = set(section) & set(SchedulerConfig.model_fields)
    return not keys or all("main" in v for v in section.values())


def sections(kind: str, section: Any) -> list[tuple[str | None, str, Any]]:
    """``(name, where, section)`` of each section of the ``optimizer:`` or ``scheduler:``
    key: one section (name None, where ``kind``) or each named one (``kind.name``)."""
    named = optimizer_named(section) if kind == "optimizer" else scheduler_named(section)
    if not named:
        return [(None, kind, section)]
    return [(str(name), f"{kind}.{name}", one) for name, one in section.items()]


def _shape(named: Callable[[Any], bool]) -> Callable[[Any], str]:
    """Which of the two shapes a value of the key has (pydantic's discriminator): read from
    the file's mapping, or from a validated one when it is written back."""

    def shape(value: Any) -> str:
        validated = isinstance(value, Mapping) and value
        if validated and all(isinstance(v, BaseModel) for v in value.values()):
            return "named"
        return "named" if named(value) else "one"

    return shape


OptimizerSections = Annotated[
    Annotated[OptimizerConfig, Tag("one")] | Annotated[dict[str, OptimizerConfig], Tag("named")],
    Discriminator(_shape(optimizer_named)),
]
"""The ``optimizer:`` key: one section or a mapping of names to sections."""

SchedulerSections = Annotated[
    Annotated[SchedulerConfig, Tag("one")] | Annotated[dict[str, SchedulerConfig], Tag("named")],
    Discriminator(_shape(scheduler_named)),
]
"""The ``scheduler:`` key: one section or a mapping of optimizer names to sections."""

#: The tags of the two shapes, which pydantic puts in an error's location (left out of lines).
SHAPES = ("one", "named")


# -- checking ---------------------------------------------------------------------------------


def optimizer_errors(section: Any) -> list[str]:
    """Problems of the ``optimizer:`` key that hold whatever the model, each section's:
    the class, its keywords (names against the signature, values tried on a throwaway
    parameter)."""
    return [e for _, where, one in sections("optimizer", section) for e in _optimizer(where, one)]


def _optimizer(where: str, section: Any) -> list[str]:
    if not isinstance(section, Mapping) or not isinstance(section.get("type"), str):
        return []  # the pydantic pass words these
    try:
        cls = find_class(section["type"], "torch.optim")
    except ConfigError as exc:
        return [f"{where}.type: {line}" for line in exc.lines]
    errors: list[str] = []
    keywords = {k: v for k, v in section.items() if k not in OptimizerConfig.model_fields}
    errors += keyword_errors(where, cls, keywords, skip=("params",))
    groups = section.get("param_groups")
    for i, group in enumerate(groups if isinstance(groups, list) else []):
        if isinstance(group, Mapping):
            extra = {k: v for k, v in group.items() if k != "params"}
            errors += keyword_errors(f"{where}.param_groups.{i}", cls, extra, ("params",))
    errors += _quoted_numbers(where, keywords)
    errors += non_finite_errors(where, section)
    if errors:
        return errors
    import torch

    try:  # torch's own range checks: a negative lr, betas out of [0, 1), ...
        cls([torch.zeros(1, requires_grad=True)], **keywords)
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, Mapping):
                cls([torch.zeros(1, requires_grad=True)], **{**keywords, **_extra(group)})
    except Exception as exc:
        return [f"{where}: {section['type']} refuses these values: {_one_line(exc)}"]
    return []


def scheduler_errors(section: Any) -> list[str]:
    """Problems of the ``scheduler:`` key found without a model, each section's: the main
    class, its keywords against the signature, ``auto`` only where a length goes."""
    return [e for _, where, one in sections("scheduler", section) for e in _scheduler(where, one)]


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
    errors += _quoted_numbers(f"{where}.main", keywords)
    errors += non_finite_errors(f"{where}.main", keywords)
    errors += [
        f"{where}.main.{key}: `auto` only fills {', '.join(AUTO_KEYS)}"
        for key, value in keywords.items()
        if value == "auto" and key not in AUTO_KEYS
    ]
    return errors


def keyword_errors(
    where: str, cls: type, keywords: Mapping[str, Any], skip: tuple[str, ...]
) -> list[str]:
    """Keywords ``cls`` does not take, one line each with a did-you-mean."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return []
    names = [n for n, p in parameters.items() if n not in skip and p.kind is not p.VAR_POSITIONAL]
    return [
        f"{where}.{key}: {cls.__name__} takes no argument {key!r}"
        f"{did_you_mean(str(key), names)} (arguments: {', '.join(names)})"
        for key in keywords
        if key not in names
    ]


def find_class(name: str, home: str) -> type:
    """``name`` in module ``home`` (``AdamW``), or a dotted path (``pkg.mod.Class``)."""
    if "." not in name:
        module = importlib.import_module(home)
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
        known = [n for n in dir(module) if isinstance(getattr(module, n), type)]
        raise ConfigError(f"{home} has no class {name!r}{did_you_mean(name, known)}")
    module_name, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise ConfigError(f"no module named {module_name!r} (from {name!r})") from None
    found = getattr(module, attr, None)
    if not isinstance(found, type):
        raise ConfigError(f"{module_name} has no class {attr!r}")
    return found


def _quoted_numbers(where: str, keywords: Mapping[str, Any]) -> list[str]:
    """Numbers YAML reads as text (``1e-3`` needs a dot: ``1.0e-3``), one line each."""
    lines = []
    for key, value in keywords.items():
        if isinstance(value, str) and value != "auto":
            try:
                number = float(value)
            except ValueError:
                continue
            written = yaml.safe_dump(number).split("\n")[0]  # 1.0e-05: a float to YAML
            lines.append(f"{where}.{key}: {value!r} is text to YAML, not a number; write {written}")
    return lines


def non_finite_errors(where: str, value: Any) -> list[str]:
    """NaN and ±inf anywhere in ``value`` (a keyword, a list such as ``betas``, a parameter
    group), one line each: torch takes most of them silently (``momentum: .nan`` trains
    every weight to NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: Input should be a finite number (got {value!r})"]
    if isinstance(value, Mapping):
        return [e for k, v in value.items() for e in non_finite_errors(f"{where}.{k}", v)]
    if isinstance(value, (list, tuple)):
        return [e for i, v in enumerate(value) for e in non_finite_errors(f"{where}.{i}", v)]
    return []


def _extra(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# -- building ---------------------------------------------------------------------------------


def build_optimizers(
    model: torch.nn.Module, section: Mapping[str, Any]
) -> torch.optim.Optimizer | dict[str, torch.optim.Optimizer]:
    """The optimizer the ``optimizer:`` key declares, or the optimizers by name when it
    names several; every section's mistakes at once."""
    built: dict[str | None, torch.optim.Optimizer] = {}
    errors: list[str] = []
    for name, where, one in sections("optimizer", section):
        try:
            built[name] = build_optimizer(model, one, where)
        except ConfigError as exc:
            errors += exc.lines
    if errors:
        raise ConfigError(errors)
    if None in built:
        return built[None]
    return {str(name): optimizer for name, optimizer in built.items()}


def build_optimizer(
    model: torch.nn.Module, section: Mapping[str, Any], where: str = "optimizer"
) -> torch.optim.Optimizer:
    """The optimizer one section declares over the trainable parameters of ``model``, or of
    its submodule ``params``; ``where`` is the section's path in the lines."""
    config = OptimizerConfig.model_validate(section)
    cls = find_class(config.type, "torch.optim")
    keywords = dict(config.model_extra or {})
    module = model if config.params is None else submodule(model, config.params, where)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ConfigError(f"{where}.params: {config.params!r} has no trainable parameter")
    buckets: list[list[tuple[str, Any]]] = [[] for _ in range(len(config.param_groups) + 1)]
    for name, param in named:
        index = next(
            (
                i + 1
                for i, g in enumerate(config.param_groups)
                if fnmatch.fnmatchcase(name, g.params)
            ),
            0,
        )
        buckets[index].append((name, param))
    errors = [
        f"{where}.param_groups.{i}.params: {g.params!r} matches no trainable parameter"
        for i, g in enumerate(config.param_groups)
        if not buckets[i + 1]
    ]
    if errors:
        raise ConfigError(errors)
    groups: list[dict[str, Any]] = []
    options: list[dict[str, Any]] = [{}, *(dict(g.model_extra or {}) for g in config.param_groups)]
    for bucket, extra in zip(buckets, options, strict=True):
        decayed = [p for n, p in bucket if not (config.no_decay and p.ndim < 2)]
        plain = [p for n, p in bucket if config.no_decay and p.ndim < 2]
        if decayed:
            groups.append({"params": decayed, **extra})
        if plain:
            groups.append({"params": plain, **extra, "weight_decay": 0.0})
    return cls(groups, **keywords)


#: How many submodule names a line lists before it shortens the list with "...".
LISTED = 8


def submodule(model: torch.nn.Module, dotted: str, where: str) -> torch.nn.Module:
    """The submodule ``dotted`` of ``model``; a name it lacks is one line naming the section
    and the submodules there are (a did-you-mean, the list shortened)."""
    module = model
    path: list[str] = []
    for part in dotted.split("."):
        children = dict(module.named_children())
        if part not in children:
            owner = ".".join(path) if path else "the model"
            names = list(children)
            listed = ", ".join(names[:LISTED]) + (", ..." if len(names) > LISTED else "")
            raise ConfigError(
                f"{where}.params: {owner} has no submodule {part!r}{did_you_mean(part, names)} "
                f"(its submodules: {listed or 'none'})"
            )
        module = children[part]
        path.append(part)
    return module


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
    for name, where, one in sections("scheduler", section):
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
        message = f"{where}.main: {cls.__name__} refuses these values: {_one_line(exc)}"
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
        targets = {name: one for name, _, one in sections("optimizer", optimizer)}
        names = None if None in targets else [str(name) for name in targets]
        errors = target_errors(section, names)
        if errors:
            return errors
    return [
        e
        for name, where, one in sections("scheduler", section)
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
        for _, _, one in sections("scheduler", scheduler or {})
        if isinstance(one, Mapping)
    ]
    return str(next(filter(None, own), None) or runner.get("scheduler_interval") or "epoch")

"""The ``optimizer:`` section of a config: checked before any work and built from the model.

The optimizer is any ``torch.optim`` class or a dotted path; its keywords are checked against
the class's signature and tried on a throwaway parameter, so torch's own range checks
(``Invalid learning rate``) surface as config errors (:mod:`hookrun.config.keywords`). The
key is one section or a mapping of names to sections (several optimizers, each training the
submodule its ``params:`` names); every check and build runs per section, its lines naming
the section's path. The ``scheduler:`` section is :mod:`hookrun.config.schedulers`'.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from hookrun.config.keywords import (
    find_class,
    keyword_errors,
    non_finite_errors,
    one_line,
    quoted_number_errors,
)
from hookrun.errors import ConfigError
from hookrun.hooks.discovery import did_you_mean

if TYPE_CHECKING:
    import torch


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


def optimizer_named(section: Any) -> bool:
    """Whether an ``optimizer:`` section is a mapping of names to sections: every value a
    mapping (one section has a ``type`` string)."""
    return (
        isinstance(section, Mapping)
        and bool(section)
        and all(isinstance(v, Mapping) for v in section.values())
    )


def named_sections(kind: str, section: Any, named: bool) -> list[tuple[str | None, str, Any]]:
    """``(name, where, section)`` of each section of the ``optimizer:`` or ``scheduler:``
    key: one section (name None, where ``kind``) or, when ``named``, each named one
    (``kind.name``)."""
    if not named:
        return [(None, kind, section)]
    return [(str(name), f"{kind}.{name}", one) for name, one in section.items()]


def optimizer_sections(section: Any) -> list[tuple[str | None, str, Any]]:
    """The sections of the ``optimizer:`` key (:func:`named_sections`)."""
    return named_sections("optimizer", section, optimizer_named(section))


def shape_discriminator(named: Callable[[Any], bool]) -> Callable[[Any], str]:
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
    Discriminator(shape_discriminator(optimizer_named)),
]
"""The ``optimizer:`` key: one section or a mapping of names to sections."""

#: The tags of the two shapes, which pydantic puts in an error's location (left out of lines).
SHAPES = ("one", "named")


# -- checking ---------------------------------------------------------------------------------


def optimizer_errors(section: Any) -> list[str]:
    """Problems of the ``optimizer:`` key that hold whatever the model, each section's:
    the class, its keywords (names against the signature, values tried on a throwaway
    parameter)."""
    return [e for _, where, one in optimizer_sections(section) for e in _optimizer(where, one)]


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
    errors += quoted_number_errors(where, keywords)
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
        return [f"{where}: {section['type']} refuses these values: {one_line(exc)}"]
    return []


def _extra(group: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


# -- building ---------------------------------------------------------------------------------


def build_optimizers(
    model: torch.nn.Module, section: Mapping[str, Any]
) -> torch.optim.Optimizer | dict[str, torch.optim.Optimizer]:
    """The optimizer the ``optimizer:`` key declares, or the optimizers by name when it
    names several; every section's mistakes at once."""
    built: dict[str | None, torch.optim.Optimizer] = {}
    errors: list[str] = []
    for name, where, one in optimizer_sections(section):
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

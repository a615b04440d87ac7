"""What a plugin is: a class with settings, a priority and ``@hookimpl`` methods."""

from __future__ import annotations

from collections.abc import Collection
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import pluggy
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from hookrun.checkpoint.storage import URL
    from hookrun.hooks.protocol import RunnerProtocol

hookimpl = pluggy.HookimplMarker("hookrun")
"""Marks a method as a hook implementation: ``@hookimpl`` (or ``@hookimpl(wrapper=True)``
for a wrapper around the other implementations); the method's name is the hook point."""


class Priority(IntEnum):
    """Where a plugin runs at every hook point: lower runs first; any int 0-100 works too."""

    HIGHEST = 0
    """0: before every other plugin."""
    VERY_HIGH = 10
    """10."""
    HIGH = 30
    """30 (timer, nan_guard: they must see a step before others change it)."""
    ABOVE_NORMAL = 40
    """40 (precise_bn)."""
    NORMAL = 50
    """50: the default (ema)."""
    BELOW_NORMAL = 60
    """60 (logger)."""
    LOW = 70
    """70 (early_stopping: decides before the checkpoint saves)."""
    VERY_LOW = 90
    """90 (checkpoint: saves after every other plugin updated its state)."""
    LOWEST = 100
    """100: after every other plugin (profiler)."""


class PluginSettings(BaseModel):
    """Base of every plugin's settings: unknown keys are errors, settings never change, and
    no float takes NaN or an infinity unless its field allows them
    (``Field(allow_inf_nan=True)``, and its description says what they mean)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    """pydantic: an unknown key is an error (did-you-mean), settings are read-only, and NaN
    and ±inf are refused."""


SettingsT = TypeVar("SettingsT", bound=PluginSettings)


class Plugin(Generic[SettingsT]):
    """Base class of installable plugins; subclasses set ``name``, ``Settings`` and hooks.
    ``Plugin[EMASettings]`` types ``self.settings`` for mypy.

    ``state_dict()`` / ``load_state_dict()`` are optional: when defined, the state is stored
    under ``checkpoint["plugins"][name]`` and given back on resume.
    """

    name: ClassVar[str] = ""
    """The entry-point name: the config key under ``plugins:`` and in checkpoints."""
    Settings: ClassVar[type[PluginSettings]] = PluginSettings
    """The pydantic model the plugin's config section is validated against."""
    report_interval_setting: ClassVar[str | None] = None
    """The setting (an int) giving the iterations between the plugin's reports, if any: a
    run that sets it and not ``runner.log_interval`` (config file or ``Runner``) gets it as
    ``log_interval`` (one knob), and the two must divide (the logger's ``interval``)."""
    checkpoint_dir_setting: ClassVar[str | None] = None
    """The setting that names the folder :meth:`checkpoint_dir` returns, if any: the config
    check names it (``plugins.checkpoint.out_dir: ... exists and is not a folder``) when that
    folder cannot be created or written."""
    priority: int = Priority.NORMAL
    """Where it runs at every hook point (lower first); a config's ``priority:`` overrides it."""
    enabled_by_default: ClassVar[bool] = True
    """Whether it runs whenever installed (unless the config disables it)."""
    renders_console: ClassVar[bool] = False
    """Whether it shows the run's progress on the console (the logger): while no enabled
    plugin does, the core prints a line at every report and after each validation/test."""

    def __init__(self, settings: SettingsT | None = None) -> None:
        self.settings: SettingsT = (
            settings if settings is not None else cast(SettingsT, self.Settings())
        )
        """The validated settings (the defaults when none were given)."""

    def unused_hooks(self, runner: RunnerProtocol) -> Collection[str]:
        """Hook points that, with these settings and this runner, have nothing to do: the
        core does not call them. Asked once, when the Runner is constructed (``runner`` is
        complete but not yet training)."""
        return ()

    @classmethod
    def export_weights(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """The model weights this plugin's checkpoint ``state`` (what its ``state_dict()``
        returned, every tensor whole) holds, as the model's own state dict, for ``hookrun
        export --ema`` and the like; ``None`` (the default) when it holds none. A class
        method: exporting trains nothing and builds no plugin, and the core need not know
        how the plugin lays out its state."""
        return None

    def checkpoint_dir(self, work_dir: Path) -> Path | URL | None:
        """The folder (or fsspec URL) this plugin writes the run's checkpoints to, or None
        (the default: it writes none). The first plugin that names one sets
        ``runner.checkpoint_dir``, where ``resume="auto"`` looks; a new run refuses a work
        dir whose checkpoints show it trained. Asked before the run starts (before the task
        is built), from the settings."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} priority={self.priority}>"


def parse_priority(value: Any, where: str) -> int:
    """Turn a priority (a ``Priority``, its name in any case, or an int 0-100) into an int;
    anything else is an error here rather than a silent default at run time."""
    if isinstance(value, str):
        try:
            return int(Priority[value.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(
                f"{where}: unknown priority {value!r} (use 0-100 or {names})"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ValueError(f"{where}: priority must be an int 0-100 or a name (got {value!r})")
    return int(value)

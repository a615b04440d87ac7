"""The YAML config file: parsed, overridden with ``--set``, validated as a whole.

Every mistake in the file is collected before any work starts and reported as one line
each, dotted path first (``plugins.ema.decay: Input should be less than 1 (got 1.5)``).
Plugin sections are checked by the plugin manager, with each plugin's own ``Settings``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from hookrun.discovery import WRITER_GROUP, did_you_mean, installed, installed_plugins
from hookrun.errors import ConfigError, HookrunError, validation_lines
from hookrun.plugin import Priority

#: What a task callable may return: the Runner's objects (everything else is config).
TASK_KEYS = (
    "model",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "optimizer",
    "scheduler",
    "criterion",
    "metrics",
    "hooks",
)


class RunnerConfig(BaseModel):
    """The ``runner:`` section: the plain keyword arguments of ``hookrun.Runner``."""

    model_config = ConfigDict(extra="forbid")

    max_epochs: int | None = Field(
        None, ge=1, description="Epochs to train (10 when neither this nor max_iters is set)."
    )
    max_iters: int | None = Field(
        None,
        ge=1,
        description="Iterations to train instead of epochs; validation then runs "
        "every val_interval iterations.",
    )
    val_interval: int = Field(
        1,
        ge=1,
        description="Validate every this many epochs (iterations with max_iters), and "
        "always at the end.",
    )
    work_dir: str = Field(
        "runs/exp",
        description="Folder for logs, TensorBoard events, checkpoints and the "
        "resolved config; a relative path is relative to the current directory.",
    )
    seed: int = Field(
        0,
        description="Seeds python, numpy and torch before the task builds the model, and "
        "the data order.",
    )
    device: str = Field("auto", description="`auto` (CUDA when available), `cpu`, `cuda:1`, ...")
    amp: Literal["bf16", "fp16"] | None = Field(
        None, description="Mixed precision: null (off), `bf16`, or `fp16` (CUDA only)."
    )
    grad_accum: int = Field(
        1, ge=1, description="Accumulate gradients over this many batches per optimizer step."
    )
    clip_grad: float | dict[str, float] | None = Field(
        None,
        description="Clip the gradient norm: a max norm, or clip_grad_norm_ keyword "
        "arguments such as {max_norm: 1.0, norm_type: 2}.",
    )
    scheduler_interval: Literal["epoch", "iter"] = Field(
        "epoch", description="Step the scheduler after every epoch or every iteration."
    )
    writers: list[str] | dict[str, dict[str, Any] | None] | None = Field(
        ["jsonl", "tensorboard"],
        description="Writer names (entry points of "
        "`hookrun.writers`), or a mapping of name to writer options; [] for none.",
    )
    ddp: dict[str, Any] | None = Field(
        None, description="Keyword arguments for DistributedDataParallel under torchrun."
    )

    @model_validator(mode="after")
    def _epochs_or_iters(self) -> RunnerConfig:
        if self.max_epochs is not None and self.max_iters is not None:
            raise ValueError("give max_epochs or max_iters, not both")
        return self


class Config(BaseModel):
    """The whole config file."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        description="What builds the model and data: `module:callable`, or "
        "`path/to/file.py:callable` relative to the config file.",
        pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$",
    )
    task_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the task callable."
    )
    runner: RunnerConfig = Field(
        default_factory=lambda: RunnerConfig.model_validate({}), description="Runner arguments."
    )
    plugins: dict[str, Any] = Field(
        default_factory=dict,
        description="Plugin name to a settings mapping (enable and "
        "configure), true (enable with defaults) or false (disable).",
    )


@dataclass
class LoadedConfig:
    """A validated config: ``data`` holds every key with defaults filled in."""

    path: Path
    data: dict[str, Any]

    @property
    def runner(self) -> dict[str, Any]:
        return self.data["runner"]

    @property
    def work_dir(self) -> Path:
        return Path(self.runner["work_dir"])

    def resolved(self) -> dict[str, Any]:
        """The config to save beside the run: task and work_dir as absolute paths, so the
        saved file works from any folder."""
        data = yaml.safe_load(yaml.safe_dump(self.data))
        target, attr = split_task(data["task"])
        if target.endswith(".py"):
            data["task"] = f"{resolve_task_file(target, self.path)}:{attr}"
        data["runner"]["work_dir"] = str(self.work_dir.resolve())
        return data


def load(
    path: str | Path, overrides: Sequence[str] = (), work_dir: str | Path | None = None
) -> LoadedConfig:
    """Read, override and validate a config file; raises ConfigError with every problem."""
    path = Path(path)
    raw = read_yaml(path)
    errors = apply_overrides(raw, overrides)
    if work_dir is not None:
        runner = raw.setdefault("runner", {})
        if isinstance(runner, dict):
            runner["work_dir"] = str(work_dir)
    errors += validate(raw, path)
    if errors:
        raise ConfigError(errors)
    data = Config.model_validate(raw).model_dump(mode="json")
    return LoadedConfig(path=path, data=data)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys (task, runner, plugins, ...)")
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """Apply ``a.b=value`` overrides in place (values parsed as YAML); returns errors."""
    errors = []
    for item in overrides:
        key, sep, text = item.partition("=")
        keys = key.strip().split(".")
        if not sep or not all(keys):
            errors.append(f"--set {item}: expected KEY=VALUE with a dotted KEY (a.b=1)")
            continue
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            errors.append(f"--set {item}: value is not valid YAML")
            continue
        node = data
        for depth, part in enumerate(keys[:-1]):
            child = node.get(part)
            if child is None or isinstance(child, bool):  # `ema: true` -> `ema: {decay: ...}`
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(f"--set {item}: {'.'.join(keys[: depth + 1])} is not a mapping")
                break
            node = child
        else:
            node[keys[-1]] = value
    return errors


def validate(raw: dict[str, Any], path: Path) -> list[str]:
    """Every error of the file: structure and runner, task target, writers, plugins."""
    errors: list[str] = []
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        errors += _lines(exc)
        config = None
    task = raw.get("task")
    if isinstance(task, str) and ":" in task:
        errors += check_task(task, path)
    runner = raw.get("runner")
    if isinstance(runner, dict) and isinstance(runner.get("writers"), (list, dict)):
        errors += check_writers(runner["writers"])
    plugins = raw.get("plugins")
    if isinstance(plugins, dict):
        errors += check_plugins(plugins)
    return errors if errors or config is not None else ["config: invalid"]


def _lines(exc: ValidationError) -> list[str]:
    """pydantic errors as lines, with did-you-mean against the fields of the right level."""
    lines = []
    for err in exc.errors():
        loc = err["loc"]
        fields: list[str] = list(Config.model_fields)
        if len(loc) > 1 and loc[0] == "runner":
            fields = list(RunnerConfig.model_fields)
        if err["type"] == "value_error" and loc == ("runner",):
            lines.append(f"runner: {err['msg'].removeprefix('Value error, ')}")
        elif err["type"] == "string_pattern_mismatch" and loc == ("task",):
            lines.append(
                "task: expected 'module:callable' or 'path/to/file.py:callable' "
                f"(got {err['input']!r})"
            )
        else:
            lines += validation_lines(_OneError(err), "", fields)
    return lines


class _OneError:
    """Feeds one pydantic error to ``validation_lines``."""

    def __init__(self, err: Any) -> None:
        self.err = err

    def errors(self) -> list[Any]:
        return [self.err]


def split_task(task: str) -> tuple[str, str]:
    target, _, attr = task.rpartition(":")
    return target, attr


def resolve_task_file(target: str, config_path: Path) -> Path:
    file = Path(target).expanduser()
    return (file if file.is_absolute() else config_path.parent / file).resolve()


def check_task(task: str, config_path: Path) -> list[str]:
    """The task's file or module exists (without importing user code)."""
    target, _ = split_task(task)
    if target.endswith(".py"):
        file = resolve_task_file(target, config_path)
        return (
            []
            if file.is_file()
            else [
                f"task: file not found: {file} (relative paths start at the config file's folder)"
            ]
        )
    with _task_path(config_path):
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):
            found = False
    return [] if found else [f"task: no module named {target!r}"]


def check_writers(writers: list[Any] | dict[str, Any]) -> list[str]:
    """Unknown writer names, and options a writer's constructor does not take."""
    from hookrun.writers import option_errors

    available = installed(WRITER_GROUP)
    errors = []
    for name in writers:
        if not isinstance(name, str):
            continue
        if name not in available:
            errors.append(f"runner.writers.{name}: unknown writer{did_you_mean(name, available)}")
        elif isinstance(writers, dict) and writers[name]:
            cls = available[name].entry_point.load()
            errors += option_errors(f"runner.writers.{name}", cls, writers[name])
    return errors


def check_plugins(plugins: dict[str, Any]) -> list[str]:
    """Run the plugin manager's own selection and validation; collect its lines."""
    from hookrun.manager import PluginManager

    try:
        PluginManager(plugins)
    except HookrunError as exc:
        return exc.lines
    return []


class _task_path:
    """Put the config's folder and the current folder on ``sys.path`` while importing."""

    def __init__(self, config_path: Path) -> None:
        self.paths = [str(Path.cwd()), str(config_path.parent.resolve())]

    def __enter__(self) -> None:
        self.added = [p for p in self.paths if p not in sys.path]
        sys.path[:0] = self.added

    def __exit__(self, *exc: object) -> None:
        for p in self.added:
            sys.path.remove(p)


def load_task(task: str, config_path: Path) -> Any:
    """Import the task callable. Errors raised by the user's module propagate as they are."""
    target, attr = split_task(task)
    if target.endswith(".py"):
        file = resolve_task_file(target, config_path)
        name = f"hookrun_task_{file.stem}"
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ConfigError(f"task: cannot import {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, str(file.parent))  # the task may import its neighbours
        spec.loader.exec_module(module)
        where = str(file)
    else:
        with _task_path(config_path):
            module = importlib.import_module(target)
        where = target
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_")]
            raise ConfigError(f"task: {where} has no {attr!r}{did_you_mean(attr, names)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"task: {where}:{attr} is not callable")
    return obj


def check_task_result(result: Any, task: str) -> dict[str, Any]:
    """The task must return a mapping of Runner objects, ``model`` included."""
    if not isinstance(result, Mapping):
        raise ConfigError(
            f"task: {task} returned {type(result).__name__}; expected a dict with model, "
            "train_dataloader, optimizer, ..."
        )
    errors = [
        f"task: {task} returned unknown key {key!r}{did_you_mean(str(key), TASK_KEYS)} "
        f"(allowed: {', '.join(TASK_KEYS)})"
        for key in result
        if key not in TASK_KEYS
    ]
    if "model" not in result:
        errors.append(f"task: {task} returned no 'model'")
    if errors:
        raise ConfigError(errors)
    return dict(result)


# -- JSON Schema and settings tables ---------------------------------------------------------


def schema() -> dict[str, Any]:
    """JSON Schema of the config file with every installed plugin's settings (plugins that
    fail to import are left out)."""
    fields: dict[str, Any] = {}
    for name, info in installed_plugins().items():
        try:
            cls = info.entry_point.load()
            settings_cls = cls.Settings
        except Exception:  # a broken third-party package must not break the schema
            continue
        section = create_model(
            f"{settings_cls.__name__}Section",
            __base__=settings_cls,
            priority=(  # type: ignore[arg-type]  # a Literal built at run time
                int | Literal[tuple(p.name for p in Priority)] | None,
                Field(
                    None,
                    description="Override the plugin's priority: 0-100 or a name "
                    f"(default {int(cls.priority)}); lower runs first.",
                ),
            ),
        )
        doc = (cls.__doc__ or "").strip().splitlines()
        fields[name] = (
            section | bool | None,
            Field(None, description=doc[0] if doc else f"The {name} plugin."),
        )
    plugins_model = create_model("Plugins", __config__=ConfigDict(extra="forbid"), **fields)
    full = create_model(
        "HookrunConfig",
        __base__=Config,
        plugins=(
            plugins_model,
            Field(
                default_factory=plugins_model,
                description=Config.model_fields["plugins"].description,
            ),
        ),
    )
    result = full.model_json_schema()
    result["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    result["title"] = "hookrun config"
    return result


def settings_rows(settings_cls: type[BaseModel]) -> list[dict[str, str]]:
    """One row per setting: name, type, default, constraints, description (for ``plugins
    show`` and the generated tables in the docs)."""
    schema = settings_cls.model_json_schema()
    defs = schema.get("$defs", {})
    rows = []
    for name, prop in schema.get("properties", {}).items():
        prop = _deref(prop, defs)
        field = settings_cls.model_fields[name]
        rows.append(
            {
                "name": name,
                "type": _type_text(prop, defs),
                "default": "required" if field.is_required() else _yaml_text(field.default),
                "constraints": _constraints(prop, defs),
                "description": field.description or "",
            }
        )
    return rows


def _deref(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref")
    if ref:
        merged = dict(defs[ref.rsplit("/", 1)[-1]])
        merged.update({k: v for k, v in prop.items() if k != "$ref"})
        return merged
    return prop


def _type_text(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    prop = _deref(prop, defs)
    if "anyOf" in prop:
        return " | ".join(dict.fromkeys(_type_text(p, defs) for p in prop["anyOf"]))
    if "const" in prop:
        return _yaml_text(prop["const"])
    if "enum" in prop:
        return " | ".join(_yaml_text(v) for v in prop["enum"])
    kind = prop.get("type", "any")
    if kind == "array" and "items" in prop:
        return f"list[{_type_text(prop['items'], defs)}]"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"dict[str, {_type_text(values, defs)}]" if isinstance(values, dict) else "mapping"
    names = {
        "integer": "int",
        "number": "float",
        "boolean": "bool",
        "string": "str",
        "null": "null",
    }
    return names.get(str(kind), str(kind))


CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "length >= {}",
    "maxLength": "length <= {}",
    "minItems": "items >= {}",
    "maxItems": "items <= {}",
    "pattern": "matches `{}`",
    "multipleOf": "multiple of {}",
}


def _constraints(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    found = []
    for option in [prop, *prop.get("anyOf", [])]:
        option = _deref(option, defs)
        found += [text.format(option[key]) for key, text in CONSTRAINTS.items() if key in option]
    return ", ".join(dict.fromkeys(found))


def _yaml_text(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()

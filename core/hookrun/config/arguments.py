"""The Runner's plain arguments: one pydantic model for the Python API and the ``runner:``
section of config files, so both accept the same values and word errors the same way.

Every mistake is reported at once, one line each: ``runner.<field>: message (got value)``.
Kept free of torch at import so that reading a config stays light.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from hookrun.errors import ConfigError, error_line

#: The largest integer torch and Python's C code take (a 64-bit signed integer).
MAX_INT = 2**63 - 1

NAME_MAX = 255
"""The longest file or folder name, in bytes, that common file systems take (ext4, XFS,
Btrfs, ZFS, APFS); a longer one fails every call with ``ENAMETOOLONG``."""

PATH_MAX = 4096
"""Linux's limit on a whole path, in bytes, its terminating NUL included."""


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot name a file or folder on common file systems (a NUL byte, a name
    longer than :data:`NAME_MAX` bytes, a path of :data:`PATH_MAX` bytes or more), or None.
    Checked where a path is given, so it is one line rather than an ``OSError`` later."""
    if "\0" in value:
        return "a path cannot hold a NUL byte"
    encoded = os.fsencode(value)
    if len(encoded) >= PATH_MAX:
        return f"the path is {len(encoded)} bytes long; file systems take at most {PATH_MAX - 1}"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (
            f"a name in the path is {len(longest)} bytes long; file systems take at most {NAME_MAX}"
        )
    return None


class ClipGradNorm(BaseModel):
    """Keyword arguments of ``torch.nn.utils.clip_grad_norm_``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_norm: float = Field(gt=0, description="Largest total gradient norm.")
    norm_type: float = Field(
        2.0,
        allow_inf_nan=True,
        description="Order of the norm (`inf` for the max norm; NaN and `-inf` are refused).",
    )

    @field_validator("norm_type")
    @classmethod
    def _number_or_inf(cls, value: float) -> float:
        """``inf`` is torch's max norm; NaN (every weight NaN after a step) and ``-inf``
        are no norm a user means."""
        if math.isnan(value) or value == -math.inf:
            raise ValueError("Input should be a finite number or inf")
        return value


class FsdpSettings(BaseModel):
    """How ``strategy: fsdp`` shards the model (``hookrun.distributed.fsdp``):
    which submodules become
    their own ``fully_shard`` units, and FSDP2's per-unit options."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    wrap: list[str] = Field(
        [],
        description="Class names of the submodules sharded as units of their own (e.g. "
        "`[TransformerBlock]`); each name must match a submodule of the model.",
    )
    min_params: int | None = Field(
        None,
        ge=1,
        description="Also shard as a unit every submodule holding at least this many "
        "parameters not already in a smaller unit (innermost first); null: by name only.",
    )
    reshard_after_forward: bool = Field(
        True,
        description="Free the gathered parameters after each unit's forward (gathered "
        "again for backward): less memory, one more all-gather per unit. The root stays "
        "gathered until backward either way (PyTorch's default: backward needs it first).",
    )
    cpu_offload: bool = Field(
        False,
        description="Keep the parameter shards, gradients and optimizer state on the CPU "
        "(FSDP2's CPUOffloadPolicy); the optimizer step then runs on the CPU.",
    )


def _clip_grad_form(value: Any) -> str:
    return "mapping" if isinstance(value, (Mapping, ClipGradNorm)) else "norm"


ClipGrad = Annotated[
    Annotated[float, Field(gt=0), Tag("norm")] | Annotated[ClipGradNorm, Tag("mapping")],
    Discriminator(_clip_grad_form),
]

#: The writers spec is checked by ``hookrun.writers.registry.writer_errors`` (it needs entry
#: points and may hold ``Writer`` instances); the schema tells editors the config-file shapes.
WritersSpec = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "array", "items": {"type": "string"}},
                {
                    "type": "object",
                    "additionalProperties": {
                        "anyOf": [{"type": "object"}, {"type": "boolean"}, {"type": "null"}]
                    },
                },
                {"type": "null"},
            ]
        }
    ),
]


class RunnerArguments(BaseModel):
    """The plain keyword arguments of ``hookrun.Runner`` (everything but its objects); no
    float takes NaN or an infinity unless its description says so."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_epochs: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="Epochs to train (10 when neither this nor max_iters is set).",
    )
    max_iters: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="Iterations to train instead of epochs; validation then runs "
        "every val_interval iterations.",
    )
    val_interval: int = Field(
        1,
        ge=1,
        le=MAX_INT,
        description="Validate every this many epochs (iterations with max_iters), and "
        "always at the end.",
    )
    val_every_n_iters: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="In epoch runs, validate every this many iterations (counted over the run) "
        "instead of at epoch ends, and once more after the last iteration when that is not a "
        "multiple (`null`: at epoch ends, every val_interval epochs).",
    )
    limit_train_batches: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="Train on at most this many batches per epoch (`null`: all); for debugging.",
    )
    limit_val_batches: int | None = Field(
        None,
        ge=1,
        le=MAX_INT,
        description="Evaluate at most this many batches of each validation or test set "
        "(`null`: all); for debugging.",
    )
    work_dir: str = Field(
        "runs/exp",
        description="Folder for logs, TensorBoard events, checkpoints and the "
        "resolved config; a relative path is relative to the current directory, and a "
        "leading `~` is the home folder.",
    )
    seed: int = Field(
        0,
        ge=0,
        lt=2**64,
        description="Seeds python, numpy and torch before the task builds the model, and "
        "the data order.",
    )
    device: str = Field(
        "auto",
        description="`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`, ...; a device "
        "that is not there is a config error.",
    )
    amp: Literal["bf16", "fp16"] | None = Field(
        None, description="Mixed precision: null (off), `bf16`, or `fp16` (CUDA only)."
    )
    grad_accum: int = Field(
        1,
        ge=1,
        le=MAX_INT,
        description="Accumulate gradients over this many batches per optimizer step.",
    )
    grad_accum_normalize: Literal["batches", "items"] = Field(
        "batches",
        description="`batches`: each micro-batch's loss is divided by grad_accum; `items`: "
        "an accumulation group's loss is its summed loss over the items its steps report "
        "(`num_items` in the outputs, e.g. non-padding tokens), as Hugging Face's Trainer.",
    )
    clip_grad: ClipGrad | None = Field(
        None,
        description="Clip the gradient norm: a max norm, or {max_norm: 1.0, norm_type: 2} "
        "(the keys of clip_grad_norm_).",
    )
    scheduler_interval: Literal["epoch", "iter"] = Field(
        "epoch", description="Step the scheduler after every epoch or every iteration."
    )
    writers: WritersSpec = Field(
        ["jsonl", "tensorboard"],
        description="Writer names (entry points of `hookrun.writers`), or a mapping of name "
        "to writer options, true (defaults) or false (off); [] for none.",
    )
    log_interval: int = Field(
        10,
        ge=1,
        le=MAX_INT,
        description="Report train scalars to the writers every this many iterations (and at "
        "epoch ends); when unset, a plugin's report interval (the logger's `interval`) if set.",
    )
    strategy: Literal["auto", "ddp", "fsdp"] = Field(
        "auto",
        description="How a multi-process run shares the model: `auto` (DDP when the world "
        "size is above 1), `ddp` or `fsdp`.",
    )
    dist_timeout: float = Field(
        600.0,
        gt=0,
        lt=1e13,  # beyond, datetime.timedelta overflows
        description="Seconds a collective operation may wait for the other ranks before "
        "the run fails.",
    )
    sync_bn: bool = Field(
        False,
        description="Convert BatchNorm layers to SyncBatchNorm in multi-process runs, so "
        "batch statistics cover the global batch.",
    )
    compile: bool | dict[str, Any] = Field(
        False,
        description="Compile the model in place with `torch.compile` before DDP/FSDP wrap it: "
        "`true`, or a mapping of `torch.compile`'s options (`{backend: aot_eager, mode: "
        "max-autotune}`); checkpoints keep plain parameter names.",
    )
    ddp: dict[str, Any] | None = Field(
        None, description="Keyword arguments for DistributedDataParallel under torchrun."
    )
    fsdp: FsdpSettings | None = Field(
        None,
        description="With `strategy: fsdp`: {wrap: [class names], min_params, "
        "reshard_after_forward, cpu_offload}; null: only the root module is sharded.",
    )
    stop_signals: list[str] = Field(
        ["SIGTERM", "SIGINT"],
        description="Signals that stop training at the next iteration boundary, with a "
        "checkpoint saved there; the process then ends by the signal (exit 128+N). Add "
        "`SIGUSR1` where a scheduler warns with it; `[]` leaves signals alone.",
    )

    @field_validator("stop_signals")
    @classmethod
    def _catchable(cls, value: list[str]) -> list[str]:
        from hookrun.engine.stop_signals import signal_name

        return list(dict.fromkeys(signal_name(raw) for raw in value))

    @field_validator("compile")
    @classmethod
    def _compile_options(cls, value: bool | dict[str, Any]) -> bool | dict[str, Any]:
        """Only ``torch.compile``'s own keywords: a typo must not pass silently."""
        if isinstance(value, dict):
            import inspect

            import torch

            from hookrun.hooks.discovery import did_you_mean

            known = [p for p in inspect.signature(torch.compile).parameters if p != "model"]
            for key in value:
                if key not in known:
                    hint = did_you_mean(key, known) or f" (options: {', '.join(known)})"
                    raise ValueError(f"{key!r} is not an option of torch.compile{hint}")
        return value

    @field_validator("work_dir", "device", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        """The Python API may pass a ``Path`` or a ``torch.device``."""
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        return str(value) if type(value).__module__ == "torch" else value

    @field_validator("work_dir")
    @classmethod
    def _a_path(cls, value: str) -> str:
        """``~`` is expanded here, once: every check, line and write then uses the same
        path (YAML and the API do not expand it as a shell does)."""
        if not value.strip():
            raise ValueError("give a folder")
        from hookrun.checkpoint.storage import url_work_dir_problem

        problem = url_work_dir_problem(value) or path_problem(value)
        if problem is None:
            value = os.path.expanduser(value)
            problem = path_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("max_iters")
    @classmethod
    def _epochs_or_iters(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_epochs") is not None:
            raise ValueError("give max_epochs or max_iters, not both")
        return value

    @field_validator("val_every_n_iters")
    @classmethod
    def _epoch_runs_only(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_iters") is not None:
            raise ValueError("for epoch runs; with max_iters validation follows val_interval")
        return value

    @property
    def clip_grad_norm(self) -> dict[str, float] | None:
        """``clip_grad`` as keyword arguments of ``clip_grad_norm_`` (None: no clipping)."""
        if isinstance(self.clip_grad, ClipGradNorm):
            return self.clip_grad.model_dump()
        return None if self.clip_grad is None else {"max_norm": self.clip_grad}


def check_arguments(**arguments: Any) -> RunnerArguments:
    """Validate the Runner's plain arguments (writers included); ConfigError with every
    problem."""
    errors = argument_errors(arguments)
    if errors:
        raise ConfigError(errors)
    return RunnerArguments.model_validate(arguments)


def argument_errors(arguments: Mapping[str, Any]) -> list[str]:
    """Every problem of the Runner's plain arguments as ``runner.<field>: ...`` lines."""
    from hookrun.writers.registry import writer_errors

    try:
        RunnerArguments.model_validate(arguments)
    except ValidationError as exc:
        errors = error_lines(exc.errors())
    else:
        errors = []
    if "writers" in arguments:
        errors += writer_errors(arguments["writers"])
    return errors


_NESTED: dict[str, type[BaseModel]] = {"clip_grad": ClipGradNorm, "fsdp": FsdpSettings}
"""Runner arguments that are mappings of their own keys (named in unknown-key errors)."""


def error_lines(errors: Sequence[Any], prefix: str = "runner") -> list[str]:
    """pydantic errors of ``RunnerArguments`` as lines: the union branches (``norm``,
    ``mapping``) left out of the path, did-you-mean for unknown keys."""
    lines = []
    for err in errors:
        loc = [str(p) for p in err["loc"] if p not in ("norm", "mapping")]
        path = ".".join([prefix, *loc])
        nested = _NESTED.get(loc[0]) if loc else None
        if err["type"] == "extra_forbidden" and nested is not None and len(loc) > 1:
            keys = list(nested.model_fields)
            line = error_line(path, err, keys, what="key") + f" (keys: {', '.join(keys)})"
        else:
            line = error_line(path, err, RunnerArguments.model_fields)
        lines.append(line)
    return lines

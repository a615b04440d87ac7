"""Settings of the checkpoint plugin: when, where and how many files it keeps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from hookrun import PluginSettings, resolve_rule, url_problem


class CheckpointSettings(PluginSettings):
    """Settings of the ``checkpoint`` plugin."""

    interval: int = Field(
        1, ge=1, description="Save every `interval` epochs (`by_epoch: true`) or iterations."
    )
    by_epoch: bool = Field(
        True,
        description="`true`: save `epoch_<N>.pt` at the end of every `interval`-th epoch; "
        "`false`: save `iter_<N>.pt` after every `interval`-th iteration (N counts completed "
        "epochs or iterations); under gradient accumulation at the end of that iteration's "
        "accumulation group.",
    )
    max_keep: int | None = Field(
        None,
        ge=1,
        description="Keep only the newest `max_keep` periodic checkpoints (`null`: keep all). "
        "The checkpoint the run resumed from and every `best_<metric>.pt` are always kept "
        "besides them.",
    )
    save_last: bool = Field(
        True,
        description="Save the final state of every run: at the end of training when the last "
        "epoch or iteration is not a multiple of `interval`, and when a hook (early stopping, "
        "for instance) ends training with `stop_training`.",
    )
    save_best: str | list[str] | None = Field(
        None,
        description="Validation metric(s) whose best value is kept in `best_<metric>.pt`, "
        "replaced only by a better score than the file holds (never the file the run resumed "
        "from); `auto` takes the first metric validation reports; `null`: no best checkpoint.",
    )
    rule: Literal["greater", "less", "auto"] = Field(
        "auto",
        validate_default=True,  # the default is checked against save_best's names too
        description="Whether a greater or a smaller `save_best` metric is better; `auto` "
        "decides from the whole words of the name (loss, error, mse, ...: less; accuracy, auc, "
        "f1, map, iou, ...: greater; the last such word wins) and is an error for a name with "
        "none of them.",
    )
    save_top_k: int | None = Field(
        None,
        ge=1,
        description="Also keep the `save_top_k` best checkpoints of each `save_best` metric as "
        "`top_<metric>_<value>_iter_<N>.pt`, deleting the one that drops out (a tie keeps the "
        "earlier); `null`: none. Needs `save_best`.",
    )
    save_optimizer: bool = Field(
        True,
        description="Store the optimizer state too; without it a resumed run restarts the "
        "optimizer's moments, so it is no longer exact.",
    )
    out_dir: str | None = Field(
        None,
        min_length=1,
        description="Folder of the checkpoints; relative paths are inside `work_dir`. Default "
        "`<work_dir>/checkpoints`. `resume: auto` looks here. An fsspec URL (`s3://bucket/run`, "
        "`gs://...`, `memory://...`, `file://...`) puts them on that storage: "
        "docs/checkpoint-storage.md.",
    )
    save_on_exception: bool = Field(
        True,
        description="When training raises (Ctrl-C included), save "
        "`emergency_iter_<N>.pt` before the exception goes on.",
    )
    async_save: bool = Field(
        False,
        description="Copy the state to host memory and write the file in a background thread, "
        "one write at a time; training only stalls for the copy.",
    )

    @field_validator("save_best")
    @classmethod
    def _check_metrics(cls, value: str | list[str] | None) -> str | list[str] | None:
        names = [value] if isinstance(value, str) else value or []
        if isinstance(value, list) and not value:
            raise ValueError("give at least one metric name, or null")
        if any(not name.strip() for name in names):
            raise ValueError("metric names must not be empty")
        if isinstance(value, list) and "auto" in value and len(value) > 1:
            raise ValueError("'auto' stands alone, not in a list of names")
        return value

    @field_validator("out_dir")
    @classmethod
    def _check_storage(cls, value: str | None) -> str | None:
        """A URL's protocol must be one fsspec knows, with its library installed."""
        problem = url_problem(value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("save_top_k")
    @classmethod
    def _check_top_k(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("save_best"):
            raise ValueError("needs save_best: the metric whose best checkpoints are kept")
        return value

    @field_validator("rule")
    @classmethod
    def _check_rule(cls, value: str, info: ValidationInfo) -> str:
        best = info.data.get("save_best")
        if value == "auto" and best not in (None, "auto"):
            for name in [best] if isinstance(best, str) else best:
                resolve_rule(name, value)
        return value

"""The ``Writer`` interface, and what every writer shares: how a run ended, images as uint8."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookrun.engine.workdir import CHECKPOINTS

#: How a run ended, handed to :meth:`Writer.finish`: trackers close their run with it.
RUN_STATUSES = ("finished", "failed", "killed")


class Writer:
    """Base class of writers; constructed as ``Writer(work_dir, **options)`` on rank 0."""

    name: str = ""
    """The writer's entry-point name: its state is saved under ``checkpoint["writers"][name]``."""

    def __init__(self, work_dir: str | Path, **options: Any) -> None:
        self.work_dir = Path(work_dir)
        """The run's folder: a writer keeps its files under it."""
        self.run_checkpoint_dir = self.work_dir / CHECKPOINTS
        """The run's checkpoint folder (what trackers upload from): ``runner.checkpoint_dir``
        once a Runner opens the writer."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """Problems of the option values, ``"<option>: <what is wrong>"`` each, found before
        the run starts (unknown option names are found from the constructor's signature); a
        line about the writer as a whole (its library is missing) is plain text, placed after
        the writer's path and a colon."""
        return []

    def write_scalar(self, name: str, value: float, step: int) -> None:
        """One value; the same as ``write_scalars({name: value}, step)``."""
        self.write_scalars({name: value}, step)

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Write host floats at ``step``: the one method every writer must implement."""
        raise NotImplementedError

    def write_image(self, name: str, image: Any, step: int) -> None:
        """Default: ignore images (a text log has nowhere to put them)."""

    def write_histogram(self, name: str, values: Any, step: int) -> None:
        """The distribution of ``values`` (a tensor or array of any shape: weights,
        gradients) at ``step``, for a plugin that logs them. TensorBoard and W&B draw it;
        the default ignores it (the JSONL log, MLflow, DVCLive and Neptune have no
        histogram of their own)."""

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Default: ignore the config."""

    def write_record(self, record: Mapping[str, Any]) -> None:
        """A structured record (a table, a summary); default: ignore it."""

    def flush(self) -> None:
        """Default: nothing buffered."""

    def close(self) -> None:
        """Release files and connections; the default flushes."""
        self.flush()

    def finish(self, status: str) -> None:
        """Close at the end of a run that ``status`` describes (one of ``RUN_STATUSES``):
        trackers mark their run with it; the default just closes."""
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs (a tracker's run id); saved in checkpoints when not empty."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Given the saved state on resume, and when the same Runner opens its writers again
        (a test pass after training), before anything is written; default: ignore it."""


def run_status(exc: BaseException | None, stopped_by_signal: bool) -> str:
    """``killed`` for a stop signal (or Ctrl-C reaching the top), ``failed`` for an
    exception, else ``finished``."""
    if isinstance(exc, KeyboardInterrupt) or (exc is None and stopped_by_signal):
        return "killed"
    return "finished" if exc is None else "failed"


def image_uint8(image: Any) -> torch.Tensor:
    """A writer's image as uint8 on the CPU, its shape kept: floats are taken as [0, 1],
    clamped (tensorboardX wraps values above 1, see FACTS) and rounded."""
    tensor = torch.as_tensor(image).detach().cpu()
    if tensor.dtype != torch.uint8:
        tensor = (tensor.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return tensor

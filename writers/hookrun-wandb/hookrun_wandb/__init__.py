"""hookrun writer for Weights & Biases: scalars, config and the run's status to one W&B run.

Online by default (W&B's own ``WANDB_MODE`` decides), offline files under the work dir when
asked, and offline with one notice when the server cannot be reached; wandb is imported
when the writer opens, so validating a config never imports it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hookrun import TrackerWriter, image_uint8

#: The exit code W&B gets for each hookrun status (non-zero shows as failed in W&B).
EXIT_CODES = {"finished": 0, "failed": 1, "killed": 143}


class WandbWriter(TrackerWriter):
    """One W&B run per hookrun run: opened at the first thing it writes, resumed from the
    run id a checkpoint holds, finished with an exit code from the run's status."""

    name = "wandb"
    library = "wandb"
    install = "'wandb>=0.25'"
    modes = ("online", "offline", "disabled")
    owned_init_kwargs = frozenset(
        {"project", "entity", "name", "tags", "mode", "dir", "id", "resume", "config"}
    )

    def __init__(
        self,
        work_dir: str | Path,
        project: str = "hookrun",
        entity: str | None = None,
        run_name: str | None = None,
        tags: Sequence[str] | None = None,
        mode: str | None = None,
        log_checkpoints: str = "none",
        checkpoint_dir: str | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(work_dir, log_checkpoints, checkpoint_dir)
        self.project = project
        self.entity = entity
        self.run_name = run_name or self.work_dir.absolute().name
        self.tags = [str(tag) for tag in tags or ()]
        self.mode = mode
        self.init_kwargs = dict(init_kwargs or {})
        self._resume_id: str | None = None
        self._config: dict[str, Any] | None = None
        self._run: Any = None

    # -- the Writer interface ----------------------------------------------------------------

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Kept until the run opens: a resume names the run to continue only after this."""
        self._config = json.loads(json.dumps(dict(config), default=str))
        if self._run is not None:
            self._run.config.update(self._config, allow_val_change=True)

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        self._open().log({name: float(value) for name, value in scalars.items()}, step=step)

    def write_image(self, name: str, image: Any, step: int) -> None:
        """``image``: CHW float in [0, 1] (clamped) or uint8; a ``wandb.Image``."""
        import wandb

        tensor = image_uint8(image)
        array = tensor.permute(1, 2, 0).numpy() if tensor.dim() == 3 else tensor.numpy()
        self._open().log({name: wandb.Image(array)}, step=step)

    def write_histogram(self, name: str, values: Any, step: int) -> None:
        """``values`` of any shape as a ``wandb.Histogram`` of 64 bins (W&B's default)."""
        import numpy
        import torch
        import wandb

        array = torch.as_tensor(values).detach().cpu().double().numpy()
        counts, edges = numpy.histogram(array, bins=64)
        self._open().log({name: wandb.Histogram(np_histogram=(counts, edges))}, step=step)

    def finish(self, status: str) -> None:
        """Checkpoints as one ``model`` artifact, ``hookrun/status`` in the summary, then
        W&B's finish with the status's exit code."""
        import wandb

        run = self._open()
        files = self.checkpoints_to_upload()
        if files:
            artifact = wandb.Artifact(f"model-{run.id}", type="model")
            for path in files:
                artifact.add_file(str(path))
            run.log_artifact(artifact, aliases=[self.log_checkpoints])
            self.mark_uploaded(*files)
        run.summary["hookrun/status"] = status
        run.finish(exit_code=EXIT_CODES.get(status, 1))

    def state_dict(self) -> dict[str, Any]:
        run_id = self._run.id if self._run is not None else self._resume_id
        return {"run_id": run_id, **super().state_dict()} if run_id else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The run to continue and the checkpoints it holds; ignored once this writer has
        opened its run."""
        if self._run is None and isinstance(state.get("run_id"), str):
            self._resume_id = state["run_id"]
            super().load_state_dict(state)

    # -- the W&B run -------------------------------------------------------------------------

    def _open(self) -> Any:
        """The run, opened (or resumed) on first use; a server that cannot be reached makes
        it an offline run, with one notice."""
        if self._run is not None:
            return self._run
        try:
            self._run = self._init(self.mode)
        except Exception as exc:
            if self.mode == "offline":
                raise
            notice(f"cannot start an online run ({type(exc).__name__}: {exc}); logging offline")
            self._run = self._init("offline")
        if self._config is not None:
            self._run.config.update(self._config, allow_val_change=True)
        return self._run

    def _init(self, mode: str | None) -> Any:
        import wandb

        return wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.run_name,
            tags=self.tags,
            mode=mode,  # type: ignore[arg-type]
            dir=str(self.work_dir),
            id=self._resume_id,
            resume="allow" if self._resume_id else None,
            reinit="create_new",
            **self.init_kwargs,
        )


def notice(message: str) -> None:
    print(f"[hookrun] wandb: {message}", file=sys.stderr, flush=True)

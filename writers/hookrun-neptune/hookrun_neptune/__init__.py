"""hookrun writer for Neptune: scalars, config and the run's status to one Neptune run.

Neptune's own mode by default (``NEPTUNE_MODE``, else async), offline when asked, and
offline with one notice when a run cannot be started online; neptune is imported when the
writer opens, so validating a config never imports it.
"""

from __future__ import annotations

import json
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hookrun import TrackerWriter, image_uint8


class NeptuneWriter(TrackerWriter):
    """One Neptune run per hookrun run, named by a ``custom_run_id`` kept in checkpoints:
    online, a resumed run and the test pass continue the same Neptune run."""

    name = "neptune"
    library = "neptune"
    install = "'neptune>=1.10,<2'"
    modes = ("async", "sync", "offline", "debug")
    owned_init_kwargs = frozenset({"project", "name", "tags", "mode", "with_id", "custom_run_id"})

    def __init__(
        self,
        work_dir: str | Path,
        project: str | None = None,
        run_name: str | None = None,
        tags: Sequence[str] | None = None,
        mode: str | None = None,
        log_checkpoints: str = "none",
        checkpoint_dir: str | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(work_dir, log_checkpoints, checkpoint_dir)
        self.project = project
        self.run_name = run_name or self.work_dir.absolute().name
        self.tags = [str(tag) for tag in tags or ()]
        self.mode = mode
        self.init_kwargs = dict(init_kwargs or {})
        self.custom_run_id = uuid.uuid4().hex
        self._config: dict[str, Any] | None = None
        self._run: Any = None

    # -- the Writer interface ----------------------------------------------------------------

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Kept until the run opens: a resume names the run to continue only after this."""
        self._config = json.loads(json.dumps(dict(config), default=str))
        if self._run is not None:
            self._log_config()

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        run = self._open()
        for name, value in scalars.items():
            run[name].append(float(value), step=step)

    def write_image(self, name: str, image: Any, step: int) -> None:
        """``image``: CHW float in [0, 1] (clamped) or uint8; a Neptune image series."""
        from neptune.types import File

        tensor = image_uint8(image)
        array = tensor.permute(1, 2, 0).numpy() if tensor.dim() == 3 else tensor.numpy()
        self._open()[name].append(File.as_image(array / 255.0), step=step)

    def finish(self, status: str) -> None:
        """Checkpoints under ``checkpoints/``, ``hookrun/status`` and ``sys/failed`` (true
        unless finished), then Neptune's ``stop()``."""
        run = self._open()
        for path in self.checkpoints_to_upload():
            run[f"checkpoints/{path.stem}"].upload(str(path))
            self.mark_uploaded(path)
        run["hookrun/status"] = status
        run["sys/failed"] = status != "finished"
        run.stop()

    def state_dict(self) -> dict[str, Any]:
        return {"custom_run_id": self.custom_run_id, **super().state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The run to continue and the checkpoints it holds; ignored once this writer has
        opened its run."""
        if self._run is None and isinstance(state.get("custom_run_id"), str):
            self.custom_run_id = state["custom_run_id"]
            super().load_state_dict(state)

    # -- the Neptune run ---------------------------------------------------------------------

    def _open(self) -> Any:
        """The run, opened on first use; one that cannot be started online (no API token,
        no project, no server) is started offline, with one notice."""
        if self._run is not None:
            return self._run
        try:
            self._run = self._init(self.mode)
        except Exception as exc:
            if self.mode in ("offline", "debug"):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            notice(f"cannot start a run online ({type(exc).__name__}: {first}); logging offline")
            self._run = self._init("offline")
        # offline storage keeps no custom_run_id: the field shows which parts are one run
        self._run["hookrun/run_id"] = self.custom_run_id
        self._log_config()
        return self._run

    def _init(self, mode: str | None) -> Any:
        import neptune

        with warnings.catch_warnings():
            # a machine without NVIDIA's library has no GPU to report: not worth a warning
            warnings.filterwarnings("ignore", message=r"Info \(NVML\)")
            return neptune.init_run(
                project=self.project,
                name=self.run_name,
                tags=self.tags,
                mode=mode,  # type: ignore[arg-type]
                custom_run_id=self.custom_run_id,
                **self.init_kwargs,
            )

    def _log_config(self) -> None:
        """The config under ``parameters`` (values Neptune cannot hold as text)."""
        from neptune.utils import stringify_unsupported

        if self._config is not None and self._run is not None:
            self._run["parameters"] = stringify_unsupported(self._config)
            self._config = None


def notice(message: str) -> None:
    print(f"[hookrun] neptune: {message}", file=sys.stderr, flush=True)

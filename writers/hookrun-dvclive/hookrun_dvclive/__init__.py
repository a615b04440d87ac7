"""hookrun writer for DVCLive: scalars, config and the run's status to DVCLive's files.

DVCLive keeps everything as files in one folder of the work dir (``metrics.json``,
``plots/metrics/<name>.tsv``, ``params.yaml``); dvclive is imported when the writer opens,
so validating a config never imports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookrun import TrackerWriter, image_uint8


class DVCLiveWriter(TrackerWriter):
    """One DVCLive folder per work dir, opened at the first thing written: a folder that
    exists is continued (DVCLive's ``resume=True``), never cleared, so a resumed run, the
    test pass after training and ``hookrun test`` all add to what training wrote."""

    name = "dvclive"
    library = "dvclive"
    install = "'dvclive>=3.40'"

    def __init__(
        self,
        work_dir: str | Path,
        dir: str = "dvclive",
        exp_name: str | None = None,
        save_dvc_exp: bool = False,
        dvcyaml: bool = False,
        log_checkpoints: str = "none",
        checkpoint_dir: str | None = None,
    ) -> None:
        super().__init__(work_dir, log_checkpoints, checkpoint_dir)
        self.dir = self.work_dir / dir
        self.exp_name = exp_name or self.work_dir.absolute().name
        self.save_dvc_exp = save_dvc_exp
        self.dvcyaml = dvcyaml
        self._config: dict[str, Any] | None = None
        self._live: Any = None

    @classmethod
    def check_own_options(cls, options: Mapping[str, Any]) -> list[str]:
        """``dir`` stays inside the work dir."""
        folder = str(options.get("dir", "dvclive"))
        if not folder or Path(folder).is_absolute() or ".." in Path(folder).parts:
            return [f"dir: a folder inside the work dir (got {folder!r})"]
        return []

    # -- the Writer interface ----------------------------------------------------------------

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Kept until the folder opens: a resume says to continue it only after this."""
        self._config = json.loads(json.dumps(dict(config), default=str))
        if self._live is not None:
            self._live.log_params(self._config)

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        live = self._open()
        live.step = step
        for name, value in scalars.items():
            live.log_metric(metric_name(name), float(value))
        live.make_summary()  # metrics.json holds the latest value of each

    def write_image(self, name: str, image: Any, step: int) -> None:
        """``image``: CHW float in [0, 1] (clamped) or uint8; ``plots/images/<name>/<step>.png``."""
        tensor = image_uint8(image)
        array = tensor.permute(1, 2, 0).numpy() if tensor.dim() == 3 else tensor.numpy()
        self._open().log_image(f"{metric_name(name)}/{step}.png", array)

    def finish(self, status: str) -> None:
        """Checkpoints as DVC artifacts, the status as the ``hookrun.status`` param, then
        DVCLive's own end (a DVC experiment with ``save_dvc_exp``)."""
        live = self._open()
        for path in self.checkpoints_to_upload():  # none marked: see state_dict
            live.log_artifact(str(path), type="model")
        live.log_param("hookrun", {"status": status})
        live.end()

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the folder is the run, continued as it is, and every pass logs all the
        checkpoint files again (``dvc add`` of an unchanged file stores nothing new)."""
        return {}

    # -- the DVCLive folder ------------------------------------------------------------------

    def _open(self) -> Any:
        """The ``Live`` of this run, created on first use; DVCLive's ``resume=False`` would
        delete an existing folder's plots and metrics, so it is only used for a new one."""
        if self._live is None:
            from dvclive import Live

            self._live = Live(
                str(self.dir),
                resume=self.dir.exists(),
                save_dvc_exp=self.save_dvc_exp,
                # DVCLive's default writes dvc.yaml into the current directory of a Git repo
                dvcyaml="dvc.yaml" if self.dvcyaml else False,
                exp_name=self.exp_name if self.save_dvc_exp else None,
            )
            if self._config is not None:
                self._live.log_params(self._config)
        return self._live


def metric_name(name: str) -> str:
    """A DVCLive name is a path under ``plots/metrics``: ``/`` keeps nesting, other
    characters outside ``[A-Za-z0-9_.-]`` become ``_``, empty and ``.``/``..`` parts go."""
    parts = [re.sub(r"[^\w.\-]", "_", part) for part in name.split("/")]
    return "/".join(p for p in parts if p not in ("", ".", "..")) or "_"

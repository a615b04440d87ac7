"""hookrun writer for MLflow: scalars, config and the run's status to one MLflow run.

The store is a local MLflow file store under the work dir unless ``tracking_uri`` or
``MLFLOW_TRACKING_URI`` names another; mlflow is imported when the writer opens, so
validating a config never imports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookrun import TrackerWriter, image_uint8

#: hookrun's run status to MLflow's ``RunStatus`` name.
STATUS = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}

#: Values longer than this (as text) go only to the ``config.yaml`` artifact.
MAX_PARAM_CHARS = 500


class MlflowWriter(TrackerWriter):
    """One MLflow run per hookrun run: opened at the first thing it writes, resumed from the
    run id a checkpoint holds, closed with the run's status."""

    name = "mlflow"
    library = "mlflow"
    install = "'mlflow-skinny>=3.0'"

    def __init__(
        self,
        work_dir: str | Path,
        tracking_uri: str | None = None,
        experiment: str = "hookrun",
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        log_checkpoints: str = "none",
        checkpoint_dir: str | None = None,
    ) -> None:
        super().__init__(work_dir, log_checkpoints, checkpoint_dir)
        self.local_uri = (self.work_dir / "mlruns").absolute().as_uri()
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or self.local_uri
        self.experiment = experiment
        self.run_name = run_name or self.work_dir.absolute().name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.run_id: str | None = None
        self._resume_id: str | None = None
        self._config: dict[str, Any] | None = None
        self._client: Any = None

    # -- the Writer interface ----------------------------------------------------------------

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Kept until the run opens: a resume names the run to continue only after this."""
        self._config = json.loads(json.dumps(dict(config), default=str))
        if self.run_id is not None:
            self._log_config()

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        run_id = self._run()
        stamp = int(time.time() * 1000)
        metrics = [Metric(metric_key(k), float(v), stamp, step) for k, v in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(run_id, metrics=metrics[start : start + 1000])

    def write_image(self, name: str, image: Any, step: int) -> None:
        """``image``: CHW float in [0, 1] (clamped) or uint8; an MLflow image series."""
        tensor = image_uint8(image)
        array = tensor.permute(1, 2, 0).numpy() if tensor.dim() == 3 else tensor.numpy()
        run_id = self._run()
        self._client.log_image(run_id, array, key=metric_key(name), step=step)

    def finish(self, status: str) -> None:
        """Checkpoints under ``checkpoints/``, then the run ends ``FINISHED``, ``FAILED``
        or ``KILLED``."""
        run_id = self._run()
        for path in self.checkpoints_to_upload():
            self._client.log_artifact(run_id, str(path), artifact_path="checkpoints")
            self.mark_uploaded(path)
        self._client.set_terminated(run_id, STATUS.get(status, "FAILED"))

    def state_dict(self) -> dict[str, Any]:
        run_id = self.run_id or self._resume_id
        return {"run_id": run_id, **super().state_dict()} if run_id else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The run to continue and the checkpoints it holds; ignored once this writer has
        opened its run."""
        if self.run_id is None and isinstance(state.get("run_id"), str):
            self._resume_id = state["run_id"]
            super().load_state_dict(state)

    # -- the MLflow run ----------------------------------------------------------------------

    def _run(self) -> str:
        """The run's id, opening it (or the resumed one) on first use; a store that cannot
        be reached is replaced by the local one, with one notice."""
        if self.run_id is not None:
            return self.run_id
        try:
            self.run_id = self._open(self.tracking_uri)
        except Exception as exc:
            if self.tracking_uri == self.local_uri:
                raise
            notice(
                f"cannot reach {self.tracking_uri} ({type(exc).__name__}); logging to the "
                f"local store {self.local_uri} instead"
            )
            self.tracking_uri = self.local_uri
            self.run_id = self._open(self.local_uri)
        self._log_config()
        return self.run_id

    def _open(self, uri: str) -> str:
        if uri.startswith("file:"):
            # mlflow-skinny has no database backend; MLflow 3 asks for this to use files
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient(tracking_uri=uri)
        if self._resume_id is not None:
            try:
                run = client.get_run(self._resume_id)
            except MlflowException:
                notice(f"run {self._resume_id} is not in {uri}; starting a new run")
            else:
                client.update_run(run.info.run_id, status="RUNNING")
                return str(run.info.run_id)
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = (
            experiment.experiment_id if experiment else client.create_experiment(self.experiment)
        )
        tags = {"hookrun.work_dir": str(self.work_dir.absolute()), **self.tags}
        return str(client.create_run(experiment_id, run_name=self.run_name, tags=tags).info.run_id)

    def _log_config(self) -> None:
        """Params for the config's short values not yet in the run (a resumed run keeps the
        values it started with), the whole config as ``config.yaml``."""
        from mlflow.entities import Param

        if self._config is None or self.run_id is None:
            return
        present = self._client.get_run(self.run_id).data.params
        params = [Param(k, v) for k, v in flatten(self._config).items() if k not in present]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self._client.log_batch(self.run_id, params=params[start : start + 100])
        self._client.log_dict(self.run_id, self._config, "config.yaml")
        self._config = None


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys to text for every value MLflow takes as a parameter: scalars and short
    lists of scalars; nested lists and long values stay in the config artifact."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{metric_key(str(key))}"
        if isinstance(value, Mapping):
            params.update(flatten(value, f"{name}."))
            continue
        if isinstance(value, (list, tuple)):
            if not all(v is None or isinstance(v, (str, int, float, bool)) for v in value):
                continue
            text = json.dumps(list(value))
        else:
            text = "null" if value is None else str(value)
        if len(text) <= MAX_PARAM_CHARS and len(name) <= 250:
            params[name] = text
    return params


def metric_key(name: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / :`` and spaces: anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in name)


def notice(message: str) -> None:
    print(f"[hookrun] mlflow: {message}", file=sys.stderr, flush=True)

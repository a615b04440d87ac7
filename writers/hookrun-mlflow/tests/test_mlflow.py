"""The mlflow writer against a real MLflow file store, read back with ``MlflowClient``.

One real ``hookrun train`` (train, validation, test, checkpoints) covers what a user of the
CLI sees; failure, resume and a server that cannot be reached run in this process. No test
reaches a network: every socket connection to an internet address is refused (and for the
CLI run recorded, and the record checked empty).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from hookrun import Runner
from hookrun.testing import (
    RaiseAt,
    isolated_env,
    jsonl_series,
    toy_runner_kwargs,
    train_without_network,
    writer_errors,
)

mlflow_tracking = pytest.importorskip("mlflow.tracking")

#: The CLI run saves checkpoints (and ``log_checkpoints: last`` is checked) where the
#: checkpoint plugin is installed; ``nox -s plugins`` runs these tests with the writer alone.
CHECKPOINTS = importlib.util.find_spec("hookrun_checkpoint") is not None


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket may connect anywhere, and MLflow sees no tracking server from outside."""

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a test tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")


def client(work_dir: Path) -> Any:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow_tracking.MlflowClient(tracking_uri=(work_dir / "mlruns").absolute().as_uri())


def only_run(work_dir: Path, experiment: str = "hookrun") -> Any:
    store = client(work_dir)
    exp = store.get_experiment_by_name(experiment)
    runs = store.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def history(work_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    points = client(work_dir).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in points)


def test_cli_train_logs_every_scalar_params_status_and_artifacts(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            """
            task: hookrun.testing:toy_task
            runner:
              max_epochs: 2
              log_interval: 2
              work_dir: runs/toy-mlflow
              writers:
                jsonl: true
                mlflow: {experiment: toys, tags: {team: vision}, log_checkpoints: last}
            """
        )
        + ("plugins: {checkpoint: {interval: 1}}\n" if CHECKPOINTS else "plugins: {}\n")
    )
    env = isolated_env()
    env.pop("MLFLOW_TRACKING_URI", None)
    train_without_network(config, tmp_path, env)
    work_dir = tmp_path / "runs" / "toy-mlflow"
    run = only_run(work_dir, "toys")
    run_id = run.info.run_id
    log = work_dir / "log.jsonl"

    # every train/loss point with its step (every 2 iterations and at the epoch ends, 3 and 6)
    loss = history(work_dir, run_id, "train/loss")
    assert [step for step, _ in loss] == [2, 3, 4, 6]
    reference = sorted(jsonl_series(log, "train/loss"))
    assert [s for s, _ in loss] == [s for s, _ in reference]
    assert [v for _, v in loss] == pytest.approx([v for _, v in reference], rel=1e-6)
    # val/accuracy once per epoch, test/accuracy from the test pass, in the same run
    assert history(work_dir, run_id, "val/accuracy") == sorted(jsonl_series(log, "val/accuracy"))
    assert [s for s, _ in history(work_dir, run_id, "val/accuracy")] == [3, 6]
    assert history(work_dir, run_id, "test/accuracy") == sorted(jsonl_series(log, "test/accuracy"))

    params = run.data.params
    assert params["runner.max_epochs"] == "2"
    assert params["runner.log_interval"] == "2"
    assert params["runner.work_dir"] == str(tmp_path / "runs" / "toy-mlflow")  # resolved
    assert not any(key.startswith("active_plugins.") for key in params)  # a table: artifact only
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "toy-mlflow"
    assert run.data.tags["team"] == "vision"

    artifacts = {a.path for a in client(work_dir).list_artifacts(run_id)}
    assert "config.yaml" in artifacts
    saved_config = yaml.safe_load(
        Path(client(work_dir).download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    )
    assert saved_config["runner"]["max_epochs"] == 2
    assert [row["name"] for row in saved_config["active_plugins"]] == (
        ["checkpoint"] if CHECKPOINTS else []
    )
    if CHECKPOINTS:  # the last checkpoint, uploaded once (the test pass found it uploaded)
        latest = (work_dir / "checkpoints" / "latest").read_text().strip()
        saved = {a.path for a in client(work_dir).list_artifacts(run_id, "checkpoints")}
        assert saved == {f"checkpoints/{latest}"}


def test_a_hook_that_raises_leaves_the_run_failed(tmp_path: Path, offline: None) -> None:
    kwargs = toy_runner_kwargs(tmp_path, writers=["mlflow"], hooks=[RaiseAt(4)], log_interval=1)
    with pytest.raises(RuntimeError, match="RaiseAt"):
        Runner(**kwargs).train()
    run = only_run(kwargs["work_dir"])
    assert run.info.status == "FAILED"
    assert [s for s, _ in history(kwargs["work_dir"], run.info.run_id, "train/loss")] == [
        1,
        2,
        3,
        4,
    ]


def test_resume_continues_the_same_run(tmp_path: Path, offline: None) -> None:
    from hookrun.testing import SaveEvery

    first = toy_runner_kwargs(tmp_path, writers=["mlflow"], max_epochs=1, hooks=[SaveEvery(3)])
    Runner(**first).train()
    work_dir = first["work_dir"]
    run_id = only_run(work_dir).info.run_id
    second = toy_runner_kwargs(tmp_path, writers=["mlflow"], max_epochs=2)
    Runner(**second).train(resume=work_dir / "checkpoints" / "epoch_1.pt")
    run = only_run(work_dir)  # still one run: the checkpoint named it
    assert run.info.run_id == run_id
    assert run.info.status == "FINISHED"
    # the epoch checkpoint precedes its validation, which the resumed run repeats at step 3
    assert [s for s, _ in history(work_dir, run_id, "val/accuracy")] == [3, 3, 6]
    assert [s for s, _ in history(work_dir, run_id, "train/loss")] == [3, 6]


def test_unreachable_server_degrades_to_the_local_store(
    tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    options = {"tracking_uri": "http://127.0.0.1:9"}  # connect() refuses it (see offline)
    kwargs = toy_runner_kwargs(tmp_path, writers={"mlflow": options}, max_epochs=1)
    Runner(**kwargs).train()
    err = capsys.readouterr().err
    assert err.count("cannot reach http://127.0.0.1:9") == 1, err
    run = only_run(kwargs["work_dir"])
    assert run.info.status == "FINISHED"
    assert history(kwargs["work_dir"], run.info.run_id, "val/accuracy")


def test_bad_options_are_named_before_the_run() -> None:
    assert writer_errors({"mlflow": {"log_checkpoint": "best"}}) == [
        "runner.writers.mlflow.log_checkpoint: unknown option (did you mean 'log_checkpoints'?) "
        "(options: tracking_uri, experiment, run_name, tags, log_checkpoints, checkpoint_dir)"
    ]
    assert writer_errors({"mlflow": {"log_checkpoints": "all"}}) == [
        "runner.writers.mlflow.log_checkpoints: expected one of best, last, none (got 'all')"
    ]


def test_a_stop_signal_leaves_the_run_killed(tmp_path: Path, offline: None) -> None:
    from hookrun.testing import SignalAt

    stop = SignalAt("after_train_iter", 2, name="SIGINT")  # a real Ctrl-C after iteration 2
    kwargs = toy_runner_kwargs(tmp_path, writers=["mlflow"], hooks=[stop], log_interval=1)
    with pytest.raises(KeyboardInterrupt):  # re-delivered once the writers are finished
        Runner(**kwargs).train()
    run = only_run(kwargs["work_dir"])
    assert run.info.status == "KILLED"
    assert [s for s, _ in history(kwargs["work_dir"], run.info.run_id, "train/loss")] == [1, 2]

"""The neptune writer's offline storage after real runs, read back operation by operation
with Neptune's own ``neptune.internal.operation.Operation.from_dict``.

One real ``hookrun train`` (train, validation, test) covers what a user of the CLI sees;
failure, resume, no API token and the option errors run in this process. Nothing may reach
a network: runs are offline and every internet connection is refused (in the CLI run also
recorded, and the record checked empty).
"""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hookrun import Runner
from hookrun.testing import (
    RaiseAt,
    SaveEvery,
    isolated_env,
    jsonl_series,
    toy_runner_kwargs,
    train_without_network,
    writer_errors,
)

operation = pytest.importorskip("neptune.internal.operation")

OFFLINE = {"NEPTUNE_MODE": "offline"}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In ``tmp_path`` (Neptune stores offline runs under ``./.neptune``), offline, with no
    socket connecting to an internet address."""
    connect = socket.socket.connect

    def refuse(self: socket.socket, address: Any) -> None:
        if isinstance(address, tuple):
            raise AssertionError(f"a test tried to connect to {address}")
        connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.chdir(tmp_path)
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NEPTUNE_API_TOKEN", raising=False)
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")


def read_runs(cwd: Path) -> list[dict[str, Any]]:
    """Each offline run under ``cwd/.neptune``, oldest first: the value of every assigned
    field and the ``(step, value)`` points of every float series, by dotted path."""
    runs = []
    folders = (cwd / ".neptune" / "offline").glob("run__*")
    for folder in sorted(
        folders, key=lambda f: json.loads((f / "metadata.json").read_text())["createdAt"]
    ):
        fields: dict[str, Any] = {}
        series: dict[str, list[tuple[int, float]]] = {}
        for log in sorted(folder.glob("data-*.log")):
            for line in log.read_text().splitlines():
                op = operation.Operation.from_dict(json.loads(line)["obj"])
                path = "/".join(op.path)
                if isinstance(op, operation.LogFloats):
                    series.setdefault(path, []).extend((v.step, v.value) for v in op.values)
                elif isinstance(op, operation.AddStrings):
                    fields[path] = sorted(set(fields.get(path, [])) | set(op.values))
                elif hasattr(op, "value"):
                    fields[path] = op.value
        runs.append({"fields": fields, "series": series})
    return runs


def test_cli_train_stores_series_parameters_and_status(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            """
            task: hookrun.testing:toy_task
            runner:
              max_epochs: 2
              log_interval: 2
              work_dir: runs/toy-neptune
              writers:
                jsonl: true
                neptune: {project: team/toys, tags: [smoke], mode: offline}
            """
        )
    )
    env = {k: v for k, v in isolated_env().items() if not k.startswith("NEPTUNE_")}
    train_without_network(config, tmp_path, {**env, **OFFLINE})
    train, test = read_runs(tmp_path)  # the test pass: a second offline part of the run
    log = tmp_path / "runs" / "toy-neptune" / "log.jsonl"
    # the test pass carried the training's custom_run_id (the same run, online)
    assert train["fields"]["hookrun/run_id"] == test["fields"]["hookrun/run_id"]

    fields, series = train["fields"], train["series"]
    assert fields["sys/name"] == "toy-neptune" and fields["sys/tags"] == ["smoke"]
    loss, reference = series["train/loss"], jsonl_series(log, "train/loss")
    assert [s for s, _ in loss] == [s for s, _ in reference] == [2, 3, 4, 6]
    assert [v for _, v in loss] == pytest.approx([v for _, v in reference], rel=1e-6)
    accuracy, expected = series["val/accuracy"], jsonl_series(log, "val/accuracy")
    assert [s for s, _ in accuracy] == [s for s, _ in expected] == [3, 6]
    assert [v for _, v in accuracy] == pytest.approx([v for _, v in expected])
    assert fields["parameters/runner/max_epochs"] == 2
    assert fields["parameters/task"] == "hookrun.testing:toy_task"
    assert (fields["hookrun/status"], fields["sys/failed"]) == ("finished", False)
    assert [s for s, _ in test["series"]["test/accuracy"]] == [6]
    assert test["fields"]["hookrun/status"] == "finished"


def test_a_hook_that_raises_marks_the_run_failed(tmp_path: Path, offline: None) -> None:
    kwargs = toy_runner_kwargs(tmp_path, writers=["neptune"], hooks=[RaiseAt(4)], log_interval=1)
    with pytest.raises(RuntimeError, match="RaiseAt"):
        Runner(**kwargs).train()
    (run,) = read_runs(tmp_path)
    assert (run["fields"]["hookrun/status"], run["fields"]["sys/failed"]) == ("failed", True)
    assert [s for s, _ in run["series"]["train/loss"]] == [1, 2, 3, 4]


def test_resume_continues_the_same_run(tmp_path: Path, offline: None) -> None:
    first = toy_runner_kwargs(tmp_path, writers=["neptune"], max_epochs=1, hooks=[SaveEvery(3)])
    Runner(**first).train()
    work_dir = first["work_dir"]
    second = toy_runner_kwargs(tmp_path, writers=["neptune"], max_epochs=2)
    Runner(**second).train(resume=work_dir / "checkpoints" / "epoch_1.pt")
    before, after = read_runs(tmp_path)
    # the checkpoint carried the custom_run_id (the same run, online)
    assert before["fields"]["hookrun/run_id"] == after["fields"]["hookrun/run_id"]
    assert [s for s, _ in after["series"]["train/loss"]] == [6]


def test_no_api_token_degrades_to_offline_with_one_notice(
    tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("NEPTUNE_MODE")
    options = {"project": "team/toys", "mode": "async"}
    kwargs = toy_runner_kwargs(tmp_path, writers={"neptune": options}, max_epochs=1)
    Runner(**kwargs).train()
    err = capsys.readouterr().err
    assert err.count("[hookrun] neptune: cannot start a run online") == 1, err
    (run,) = read_runs(tmp_path)
    assert [s for s, _ in run["series"]["val/accuracy"]] == [3]


def test_bad_options_are_named_before_the_run() -> None:
    assert writer_errors({"neptune": {"projcet": "x"}})[0].startswith(
        "runner.writers.neptune.projcet: unknown option (did you mean 'project'?)"
    )
    assert writer_errors({"neptune": {"mode": "online", "init_kwargs": {"with_id": "X-1"}}}) == [
        "runner.writers.neptune.mode: expected one of async, sync, offline, debug (got 'online')",
        "runner.writers.neptune.init_kwargs.with_id: set by the writer (use its own options)",
    ]

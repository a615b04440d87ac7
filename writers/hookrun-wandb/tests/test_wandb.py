"""The wandb writer's offline run files after real runs, read back record by record with
W&B's own protobuf messages (``wandb.proto.wandb_internal_pb2.Record``).

One real ``hookrun train`` (train, validation, test, checkpoints) covers what a user of the
CLI sees; failure, resume and the option errors run in this process. Nothing may reach a
network: runs are offline, W&B's error reporting is off, and every internet connection is
refused (in the CLI run also recorded, and the record checked empty).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import struct
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hookrun import Runner, hookimpl
from hookrun.testing import (
    RaiseAt,
    SaveEvery,
    isolated_env,
    jsonl_series,
    toy_runner_kwargs,
    train_without_network,
    writer_errors,
)

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

OFFLINE = {"WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true"}

#: The CLI run saves checkpoints (and ``log_checkpoints: last`` is checked) where the
#: checkpoint plugin is installed; ``nox -s plugins`` runs these tests with the writer alone.
CHECKPOINTS = importlib.util.find_spec("hookrun_checkpoint") is not None


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No socket may connect to an internet address; W&B offline and quiet."""
    connect = socket.socket.connect

    def refuse(self: socket.socket, address: Any) -> None:
        if isinstance(address, tuple):
            raise AssertionError(f"a test tried to connect to {address}")
        connect(self, address)  # wandb-core's local socket

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")


def records(path: Path) -> Iterator[Any]:
    """The records of a ``.wandb`` file: W&B's header, then LevelDB log blocks of 32 KiB
    whose chunks (FULL 1, FIRST 2, MIDDLE 3, LAST 4) join into ``Record`` messages."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_runs(work_dir: Path) -> dict[str, Any]:
    """Everything the offline runs of ``work_dir`` hold, by record kind, in file order,
    once W&B's service has written all it was sent (as when a process ends)."""
    import wandb

    wandb.teardown()  # run.finish() may return before wandb-core wrote its last records
    found: dict[str, Any] = {"run": [], "history": [], "config": {}, "summary": {}, "exit": []}
    found["artifact"] = []
    for path in sorted((work_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                found["run"].append(record.run)
                found["config"].update(_items(record.run.config.update))
            elif kind == "config":
                found["config"].update(_items(record.config.update))
            elif kind == "history":
                found["history"].append(_items(record.history.item))
            elif kind == "summary":
                found["summary"].update(_items(record.summary.update))
            elif kind == "exit":
                found["exit"].append(record.exit.exit_code)
            elif kind == "artifact":
                found["artifact"].append(record.artifact)
    return found


def _items(items: Any) -> dict[str, Any]:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def points(found: dict[str, Any], key: str) -> list[tuple[int, float]]:
    return [(row["_step"], row[key]) for row in found["history"] if key in row]


def test_cli_train_writes_history_config_status_and_checkpoint(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            """
            task: hookrun.testing:toy_task
            runner:
              max_epochs: 2
              log_interval: 2
              work_dir: runs/toy-wandb
              writers:
                jsonl: true
                wandb: {project: toys, tags: [smoke], mode: offline, log_checkpoints: last}
            """
        )
        + ("plugins: {checkpoint: {interval: 1}}\n" if CHECKPOINTS else "plugins: {}\n")
    )
    env = {k: v for k, v in isolated_env().items() if not k.startswith("WANDB_")}
    train_without_network(config, tmp_path, {**env, **OFFLINE})
    work_dir = tmp_path / "runs" / "toy-wandb"
    found = read_runs(work_dir)
    log = work_dir / "log.jsonl"

    assert {run.run_id for run in found["run"]} == {found["run"][0].run_id}  # one W&B run
    run = found["run"][0]
    assert (run.project, run.display_name, list(run.tags)) == ("toys", "toy-wandb", ["smoke"])
    loss, reference = points(found, "train/loss"), jsonl_series(log, "train/loss")
    assert [s for s, _ in loss] == [s for s, _ in reference] == [2, 3, 4, 6]
    assert [v for _, v in loss] == pytest.approx([v for _, v in reference], rel=1e-6)
    accuracy, expected = points(found, "val/accuracy"), jsonl_series(log, "val/accuracy")
    assert [s for s, _ in accuracy] == [s for s, _ in expected] == [3, 6]
    assert [v for _, v in accuracy] == pytest.approx([v for _, v in expected])
    assert [s for s, _ in points(found, "test/accuracy")] == [6]  # the test pass, same run

    assert found["config"]["runner"]["max_epochs"] == 2
    assert found["config"]["task"] == "hookrun.testing:toy_task"
    assert found["summary"]["hookrun/status"] == "finished"
    assert found["exit"][-1] == 0
    if CHECKPOINTS:  # the last checkpoint, logged once (the test pass found it logged)
        latest = (work_dir / "checkpoints" / "latest").read_text().strip()
        (artifact,) = found["artifact"]
        assert artifact.type == "model" and "last" in list(artifact.aliases)
        assert [entry.path for entry in artifact.manifest.contents] == [latest]


def test_a_hook_that_raises_leaves_the_run_failed(tmp_path: Path, offline: None) -> None:
    kwargs = toy_runner_kwargs(tmp_path, writers=["wandb"], hooks=[RaiseAt(4)], log_interval=1)
    with pytest.raises(RuntimeError, match="RaiseAt"):
        Runner(**kwargs).train()
    found = read_runs(kwargs["work_dir"])
    assert found["summary"]["hookrun/status"] == "failed"
    assert found["exit"] == [1]
    assert [s for s, _ in points(found, "train/loss")] == [1, 2, 3, 4]


def test_resume_continues_the_same_run(tmp_path: Path, offline: None) -> None:
    first = toy_runner_kwargs(tmp_path, writers=["wandb"], max_epochs=1, hooks=[SaveEvery(3)])
    Runner(**first).train()
    work_dir = first["work_dir"]
    second = toy_runner_kwargs(tmp_path, writers=["wandb"], max_epochs=2)
    Runner(**second).train(resume=work_dir / "checkpoints" / "epoch_1.pt")
    found = read_runs(work_dir)
    assert len({run.run_id for run in found["run"]}) == 1  # the checkpoint named the run
    assert [s for s, _ in points(found, "train/loss")] == [3, 6]
    assert found["exit"] == [0, 0]


def test_bad_options_are_named_before_the_run() -> None:
    assert writer_errors({"wandb": {"projetc": "x"}})[0].startswith(
        "runner.writers.wandb.projetc: unknown option (did you mean 'project'?)"
    )
    assert writer_errors(
        {"wandb": {"mode": "airplane", "log_checkpoints": "all", "init_kwargs": {"id": "x"}}}
    ) == [
        "runner.writers.wandb.mode: expected one of online, offline, disabled (got 'airplane')",
        "runner.writers.wandb.log_checkpoints: expected one of best, last, none (got 'all')",
        "runner.writers.wandb.init_kwargs.id: set by the writer (use its own options)",
    ]


def test_no_login_degrades_to_an_offline_run_with_one_notice(
    tmp_path: Path, offline: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B has no key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    kwargs = toy_runner_kwargs(tmp_path, writers={"wandb": {"mode": "online"}}, max_epochs=1)
    Runner(**kwargs).train()
    err = capsys.readouterr().err
    assert err.count("[hookrun] wandb: cannot start an online run") == 1, err
    found = read_runs(kwargs["work_dir"])
    assert [s for s, _ in points(found, "val/accuracy")] == [3]
    assert found["exit"] == [0]


class WeightHistogram:
    """Writes the model's weight as a histogram after each epoch, as a plugin would."""

    @hookimpl
    def after_train_epoch(self, runner: Any) -> None:
        for writer in runner.writers:
            writer.write_histogram("weights/linear", runner.unwrapped_model.weight, runner.iter)


def test_a_histogram_is_a_wandb_histogram_of_the_values(tmp_path: Path, offline: None) -> None:
    import numpy

    kwargs = toy_runner_kwargs(tmp_path, writers=["wandb"], hooks=[WeightHistogram()])
    runner = Runner(**kwargs)
    runner.train()
    found = read_runs(kwargs["work_dir"])
    rows = [row for row in found["history"] if "weights/linear/_type" in row]  # flattened
    assert [row["_step"] for row in rows] == [3, 6]  # after each epoch of 3 iterations
    weight = runner.unwrapped_model.weight.detach().double().numpy()
    counts, edges = numpy.histogram(weight, bins=64)
    last = rows[-1]
    assert last["weights/linear/_type"] == "histogram"
    assert last["weights/linear/values"] == counts.tolist() and sum(counts) == weight.size
    assert last["weights/linear/bins"] == pytest.approx(edges.tolist())

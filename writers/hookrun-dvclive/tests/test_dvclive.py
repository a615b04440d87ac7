"""The dvclive writer's files after real runs, read back with DVCLive's own parsers.

One real ``hookrun train`` (train, validation, test) covers what a user of the CLI sees;
failure, resume and the option errors run in this process. Nothing may reach a network:
the CLI run's internet connections are refused and recorded (the record is checked empty),
the in-process ones refused, and DVC's analytics and Studio are switched off.
"""

from __future__ import annotations

import socket
import subprocess
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

dvclive_utils = pytest.importorskip("dvclive.utils")
from dvclive.serialize import load_yaml  # noqa: E402

OFFLINE = {"DVC_NO_ANALYTICS": "1", "DVCLIVE_OPEN": "0"}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In ``tmp_path``, a Git repo with a commit (where DVCLive would write its dvc.yaml; it
    fails in one without commits); no socket may connect anywhere; no analytics, no
    Studio token."""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], check=True)
    monkeypatch.chdir(tmp_path)

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a test tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DVC_STUDIO_TOKEN", raising=False)
    monkeypatch.setenv("HOOKRUN_PLUGINS_AUTOLOAD", "0")


def series(folder: Path, name: str) -> list[tuple[int, float]]:
    """``plots/metrics/<name>.tsv`` through DVCLive's ``parse_tsv``."""
    rows = dvclive_utils.parse_tsv(folder / "plots" / "metrics" / f"{name}.tsv")
    column = name.rsplit("/", 1)[-1]
    return [(int(row["step"]), float(row[column])) for row in rows]


def test_cli_train_writes_metrics_plots_params_and_status(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            """
            task: hookrun.testing:toy_task
            runner:
              max_epochs: 2
              log_interval: 2
              work_dir: runs/toy-dvclive
              writers: {jsonl: true, dvclive: true}
            """
        )
    )
    env = {k: v for k, v in isolated_env().items() if not k.startswith("DVC_STUDIO")}
    train_without_network(config, tmp_path, {**env, **OFFLINE})
    work_dir = tmp_path / "runs" / "toy-dvclive"
    folder = work_dir / "dvclive"
    log = work_dir / "log.jsonl"

    loss = series(folder, "train/loss")
    reference = jsonl_series(log, "train/loss")
    assert [s for s, _ in loss] == [s for s, _ in reference] == [2, 3, 4, 6]
    assert [v for _, v in loss] == pytest.approx([v for _, v in reference], rel=1e-6)
    accuracy, expected = series(folder, "val/accuracy"), jsonl_series(log, "val/accuracy")
    assert [s for s, _ in accuracy] == [s for s, _ in expected] == [3, 6]
    assert [v for _, v in accuracy] == pytest.approx([v for _, v in expected])
    assert [s for s, _ in series(folder, "test/accuracy")] == [6]  # the test pass added it

    latest = dvclive_utils.parse_json(folder / "metrics.json")
    assert latest["step"] == 6
    assert latest["train"]["loss"] == pytest.approx(loss[-1][1])
    assert latest["test"]["accuracy"] == pytest.approx(jsonl_series(log, "test/accuracy")[-1][1])

    params = load_yaml(folder / "params.yaml")
    assert params["runner"]["max_epochs"] == 2
    assert params["task"] == "hookrun.testing:toy_task"
    assert params["hookrun"] == {"status": "finished"}


def test_a_hook_that_raises_records_failed(tmp_path: Path, offline: None) -> None:
    kwargs = toy_runner_kwargs(tmp_path, writers=["dvclive"], hooks=[RaiseAt(4)], log_interval=1)
    with pytest.raises(RuntimeError, match="RaiseAt"):
        Runner(**kwargs).train()
    folder = kwargs["work_dir"] / "dvclive"
    assert load_yaml(folder / "params.yaml")["hookrun"] == {"status": "failed"}
    assert [s for s, _ in series(folder, "train/loss")] == [1, 2, 3, 4]


def test_resume_adds_to_the_same_files(tmp_path: Path, offline: None) -> None:
    first = toy_runner_kwargs(tmp_path, writers=["dvclive"], max_epochs=1, hooks=[SaveEvery(3)])
    Runner(**first).train()
    work_dir = first["work_dir"]
    second = toy_runner_kwargs(tmp_path, writers=["dvclive"], max_epochs=2)
    Runner(**second).train(resume=work_dir / "checkpoints" / "epoch_1.pt")
    folder = work_dir / "dvclive"
    assert [s for s, _ in series(folder, "train/loss")] == [3, 6]
    # the epoch checkpoint precedes its validation, which the resumed run repeats
    assert [s for s, _ in series(folder, "val/accuracy")] == [3, 3, 6]
    assert dvclive_utils.parse_json(folder / "metrics.json")["step"] == 6
    assert not (tmp_path / "dvc.yaml").exists()  # nothing written outside the work dir


def test_bad_options_are_named_before_the_run() -> None:
    assert writer_errors({"dvclive": {"dirr": "x"}}) == [
        "runner.writers.dvclive.dirr: unknown option (did you mean 'dir'?) "
        "(options: dir, exp_name, save_dvc_exp, dvcyaml, log_checkpoints, checkpoint_dir)"
    ]
    assert writer_errors({"dvclive": {"dir": "../elsewhere", "log_checkpoints": "all"}}) == [
        "runner.writers.dvclive.dir: a folder inside the work dir (got '../elsewhere')",
        "runner.writers.dvclive.log_checkpoints: expected one of best, last, none (got 'all')",
    ]

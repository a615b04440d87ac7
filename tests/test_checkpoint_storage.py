"""Checkpoints on fsspec URLs (docs/checkpoint-storage.md): ``s3://`` against a real
S3-compatible server (moto's, one per module, started by ``tests/_support/moto_s3.py``) with
``hookrun train`` in fresh processes, and ``memory://`` in this process."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from _support.moto_s3 import S3Server, s3_filesystem
from _support.moto_s3 import moto_s3 as moto_s3  # the fixture, used by name
from hookrun import Runner
from hookrun.testing import (
    assert_same_checkpoint,
    assert_states_equal,
    free_port,
    resume_task_kwargs,
    run_cli,
    run_job,
    write_toy_task,
)

TASK = Path(__file__).parent / "jobs" / "storage_task.py"
# 7 batches an epoch, 2 epochs: iter_2.pt ... iter_14.pt, the 2 newest kept
CONFIG = """\
task: {task}:build
runner: {{max_epochs: 2, device: cpu, writers: [jsonl], seed: 7}}
plugins:
  checkpoint: {{out_dir: "{out_dir}", by_epoch: false, interval: 2, max_keep: 2}}
  logger: false
  timer: false
"""
OWN = {"iter_12.pt", "iter_14.pt", "latest"}  # what a finished run leaves under its prefix


def config(folder: Path, out_dir: str) -> Path:
    path = folder / f"{uuid.uuid4().hex}.yaml"
    path.write_text(CONFIG.format(task=TASK, out_dir=out_dir))
    return path


def train(config: Path, work_dir: Path, *args: str, expect: int = 0, **env: str) -> str:
    """``hookrun train CONFIG`` in a fresh process; its stdout and stderr."""
    command = ["-m", "hookrun", "train", str(config), "--work-dir", str(work_dir), *args]
    proc = run_job(command, expect=expect, env={**os.environ, **env})
    return proc.stdout + proc.stderr


def objects(fs: Any, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` (any depth) by its name below it, with its bytes."""
    found = fs.find(prefix)
    return {key.removeprefix(prefix + "/"): fs.cat_file(key) for key in found}


@pytest.fixture(scope="module")
def s3_runs(moto_s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The launches the S3 tests share: an uninterrupted run to ``s3://bucket/ref`` (a
    foreign object put under its prefix first), a run to ``s3://bucket/run`` SIGKILLed as
    iteration 9 starts (iter_8.pt written), and ``--resume auto`` of it in a new work dir (a
    new machine: nothing local survives)."""
    tmp = tmp_path_factory.mktemp("s3")
    fs = s3_filesystem()
    fs.makedirs("bucket", exist_ok=True)
    fs.pipe_file("bucket/ref/notes.txt", b"the user's own object")
    train(config(tmp, "s3://bucket/ref"), tmp / "ref")
    killed = train(config(tmp, "s3://bucket/run"), tmp / "a", expect=-9, STORAGE_KILL_AT="9")
    after_kill = objects(fs, "bucket/run")
    resumed = train(config(tmp, "s3://bucket/run"), tmp / "b", "--resume", "auto")
    return {"fs": fs, "killed": killed, "after_kill": after_kill, "resumed": resumed, "tmp": tmp}


def test_sigkill_then_resume_auto_from_s3_on_a_new_machine_is_bit_identical(s3_runs):
    assert "checkpoint: saved iter_8.pt" in s3_runs["killed"]
    assert set(s3_runs["after_kill"]) == {"iter_6.pt", "iter_8.pt", "latest"}
    assert s3_runs["after_kill"]["latest"] == b"iter_8.pt\n"
    assert "resumed from s3://bucket/run/iter_8.pt at iteration 8" in s3_runs["resumed"]
    fs, tmp = s3_runs["fs"], s3_runs["tmp"]
    reference, resumed = objects(fs, "bucket/ref"), objects(fs, "bucket/run")
    for name, data in (("reference.pt", reference), ("resumed.pt", resumed)):
        (tmp / name).write_bytes(data["iter_14.pt"])
    assert_same_checkpoint(tmp / "reference.pt", tmp / "resumed.pt")


def test_the_bucket_holds_no_partial_or_temporary_object(s3_runs):
    fs = s3_runs["fs"]
    # no temporary name, nothing else; iter_8.pt stays as the file the run resumed from
    assert set(objects(fs, "bucket/run")) == OWN | {"iter_8.pt"}
    for name, data in objects(fs, "bucket/run").items():
        if name.endswith(".pt"):
            torch.load(io.BytesIO(data), weights_only=True)  # whole
    uploads = fs.call_s3("list_multipart_uploads", Bucket="bucket")
    assert not uploads.get("Uploads")  # no upload left unfinished either


def test_retention_on_s3_deletes_only_objects_the_plugin_wrote(s3_runs):
    left = objects(s3_runs["fs"], "bucket/ref")
    assert set(left) == OWN | {"notes.txt"}  # iter_2 ... iter_10 deleted, the foreign one kept
    assert left["notes.txt"] == b"the user's own object"
    assert left["latest"] == b"iter_14.pt\n"


@pytest.mark.parametrize("where", ["memory", "s3 async"])
def test_resume_from_a_url_in_one_process_is_exact(request, tmp_path, where):
    """A run saving to ``memory://`` (or to S3 from a background thread), and a second run
    in another work dir resuming from its iter_8.pt: the same final weights and optimizer
    state as the first run's end."""
    if where == "memory":
        out_dir, options = f"memory://storage-test/{uuid.uuid4().hex}", {}
    else:
        request.getfixturevalue("moto_s3")
        s3_filesystem().makedirs("bucket", exist_ok=True)
        out_dir, options = f"s3://bucket/{uuid.uuid4().hex}", {"async_save": True}
    plugins = {"checkpoint": {"out_dir": out_dir, "by_epoch": False, "interval": 2, **options}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = Runner(**resume_task_kwargs(tmp_path / "first", plugins=plugins))
        first.train()
        whole = first.checkpoint_state()
        second = Runner(**resume_task_kwargs(tmp_path / "second", plugins=plugins))
        second.train(resume=f"{out_dir}/iter_8.pt")
    finally:
        torch.set_num_threads(threads)
    assert str(second.resumed_from) == f"{out_dir}/iter_8.pt"
    assert_states_equal(model_and_optimizer_of(whole), model_and_optimizer_of(second))


def model_and_optimizer_of(run: Runner | dict[str, Any]) -> dict[str, Any]:
    state = run if isinstance(run, dict) else run.checkpoint_state()
    return {"model": state["model"], "optimizers": state["optimizers"]}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "plugins.checkpoint.out_dir=foo://bucket/run",
            "plugins.checkpoint.out_dir: unknown storage protocol 'foo://'",
        ),
        ("runner.work_dir=s3://bucket/run", "runner.work_dir: a URL is no work dir"),
    ],
)
def test_a_bad_url_setting_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path, setting, message):
    config_path = write_toy_task(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run_cli(capsys, "train", config_path, "--set", setting)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert sorted(tmp_path.rglob("*")) == before  # no `s3:` or `foo:` folder, no run folder


def test_resume_from_an_unknown_protocol_is_one_line_and_exit_2(capsys, tmp_path):
    config_path = write_toy_task(tmp_path)
    work_dir = tmp_path / "run"
    args = ("train", config_path, "--work-dir", work_dir, "--resume", "foo://x/iter_2.pt")
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert err.strip().splitlines() == [
        "foo://x/iter_2.pt: unknown storage protocol 'foo://' (fsspec knows none by that name)"
    ], err
    assert not work_dir.exists()


def test_s3_without_s3fs_names_pip_install_s3fs(tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "s3fs").mkdir(parents=True)
    (hidden / "s3fs" / "__init__.py").write_text("raise ImportError('No module named s3fs')\n")
    path = os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
    output = train(config(tmp_path, "s3://bucket/run"), tmp_path / "run", expect=2, PYTHONPATH=path)
    lines = output.strip().splitlines()
    assert lines == [
        "plugins.checkpoint.out_dir: s3:// needs s3fs: pip install s3fs (got 's3://bucket/run')"
    ], output
    assert not (tmp_path / "run").exists()


def test_an_unreachable_endpoint_is_one_line_and_exit_2(tmp_path):
    pytest.importorskip("s3fs")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    env["AWS_MAX_ATTEMPTS"] = "1"  # the line is under test, not botocore's retry backoff
    output = train(config(tmp_path, "s3://bucket/run"), tmp_path / "run", expect=2, **env)
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "s3://bucket/run: cannot reach the storage" in lines[0], output
    assert endpoint in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("resume", [[], ["--resume", "auto"]], ids=["fresh", "resume-auto"])
def test_a_missing_bucket_is_one_line_and_exit_2(capsys, moto_s3, tmp_path, resume):
    fs = s3_filesystem()
    before = fs.ls("")
    work_dir = tmp_path / "run"
    config_path = config(tmp_path, "s3://no-such-bucket/run")
    code, out, err = run_cli(capsys, "train", config_path, "--work-dir", work_dir, *resume)
    assert code == 2
    assert err.strip().splitlines() == [
        "s3://no-such-bucket/run: the bucket 'no-such-bucket' does not exist"
    ], err
    assert not work_dir.exists() and fs.ls("") == before

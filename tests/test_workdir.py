"""Work dirs: one run at a time (a lock naming its holder), a failed start does not block,
``--resume auto`` on a finished run changes nothing. Real ``python -m hookrun train``
processes for the command line."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hookrun.checkpoint import resume as run_resume
from hookrun.cli import prepare as launch
from hookrun.config import file as cfg
from hookrun.engine import workdir, workdir_hold
from hookrun.engine.runner import Runner
from hookrun.errors import HookrunError, WorkDirBusyError
from hookrun.testing import forked, isolated_env, run_cli, toy_runner_kwargs, write_toy_task
from hookrun.writers import JsonlWriter, TensorBoardWriter, Writer


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write_toy_task(
        tmp_path,
        """
        task: toytask.py:build
        runner: {max_epochs: 2, device: cpu, writers: [jsonl, tensorboard]}
        plugins: {checkpoint: true, logger: false, timer: false}
        """,
    )


def env() -> dict[str, str]:
    """Only the plugins the toy config names load (other installed ones print nothing)."""
    return isolated_env({k: v for k, v in os.environ.items() if k != "RANK"})


def command(*args: object) -> list[str]:
    return [sys.executable, "-m", "hookrun", *map(str, args)]


def hookrun(*args: object) -> subprocess.CompletedProcess[str]:
    return forked.run(command(*args), capture_output=True, text=True, env=env(), timeout=120)


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file with its size, modification time and digest (the lock file by content);
    Python's bytecode cache of a task module the config check imported is left out."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            stat = path.stat()
            mtime = 0 if path.name == workdir_hold.LOCK_NAME else stat.st_mtime_ns
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(folder))] = (stat.st_size, mtime, digest)
    return found


def paused_run(toy: Path, work: Path, tmp_path: Path) -> subprocess.Popen[str]:
    """A ``hookrun train`` held in before_train, after its writers opened."""
    process = forked.spawn(
        command("train", toy, "--work-dir", work, "--set", f"task_args.pause_dir={tmp_path}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the first run never started training"
        time.sleep(0.02)
    return process


def probe_lock(work: Path) -> bool:
    """Whether another process can take the work dir's lock now."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(work / workdir_hold.LOCK_NAME)!r}, os.O_RDONLY)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(1)\n"
    )
    return forked.run([sys.executable, "-c", code]).returncode == 0


# -- the lock ------------------------------------------------------------------------------


def test_a_second_run_is_refused_naming_the_holder_and_a_killed_holder_blocks_nothing(
    toy, tmp_path
):
    work = tmp_path / "run"
    first = paused_run(toy, work, tmp_path)
    try:
        before = snapshot(work)
        expected = (
            f"work dir {work} is in use by another hookrun run (pid {first.pid} on host "
            f"{socket.gethostname()}); wait for it or use another --work-dir"
        )
        seconds = [  # side by side: each takes a couple of seconds to start
            forked.spawn(
                command("train", toy, "--work-dir", work, *extra),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env(),
            )
            for extra in ([], ["--resume", "auto"])
        ]
        evaluation = forked.spawn(  # val and test take the lock too: they append logs
            command("val", toy, "--work-dir", work),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for second in seconds:
            out, err = second.communicate(timeout=120)
            assert second.returncode == 2, err
            assert err.strip() == expected and out == ""
        out, err = evaluation.communicate(timeout=120)
        assert (evaluation.returncode, out) == (2, "")
        assert err.strip() == expected.replace("use another", "evaluate into another")
        assert snapshot(work) == before  # no config.yaml rewritten, no log line

        # the Python API is refused the same way, before its writers open
        runner = launch.build_runner(cfg.load(toy, [], work))
        with pytest.raises(WorkDirBusyError, match=f"pid {first.pid} on host"):
            runner.train()
        assert snapshot(work) == before

        first.send_signal(signal.SIGKILL)  # no handler runs: the lock file stays behind
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
        first.communicate()
    assert (work / workdir_hold.LOCK_NAME).exists() and probe_lock(work)

    # killed before any iteration: nothing blocks the same command, which starts over; so
    # does a first iteration that raised (its emergency checkpoint is at iteration 0)
    failed = hookrun("train", toy, "--work-dir", work, "--set", "task_args.fail_in_forward=true")
    assert failed.returncode == 1
    assert f"work dir {work} holds a run that never completed an iteration" in failed.stdout
    assert (work / "checkpoints" / "emergency_iter_0.pt").is_file()
    done = hookrun("train", toy, "--work-dir", work)
    assert done.returncode == 0, done.stderr
    assert "starting over in it" in done.stdout and "emergency_iter_0.pt" in done.stdout
    assert {p.name for p in (work / "checkpoints").iterdir()} == {
        "epoch_1.pt",
        "epoch_2.pt",
        "latest",
    }
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    assert "config" in records[0] and sum("config" in r for r in records) == 2  # train, test
    assert len(list((work / "tensorboard").glob("events.out.tfevents.*"))) == 2

    # a work dir with checkpoints and logged steps is still refused
    with pytest.raises(HookrunError, match=f"work dir {work} already holds a run"):
        launch.check_fresh_work_dir(cfg.load(toy, [], work))


def test_the_lock_is_reentrant_released_at_the_end_and_not_kept_by_forked_children(tmp_path):
    work = tmp_path / "run"
    with workdir_hold.hold(work):
        assert not probe_lock(work)
        data = json.loads((work / workdir_hold.LOCK_NAME).read_text())
        assert data["pid"] == os.getpid() and data["host"] == socket.gethostname()
        with workdir_hold.hold(work):  # Runner.train inside the CLI's hold
            pass
        assert not probe_lock(work)
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # a DataLoader worker, say: it outlives the hold below
            os.close(write)
            os.read(read, 1)
            os._exit(0)
        os.close(read)
    try:
        assert probe_lock(work)  # the child's inherited descriptor holds nothing
    finally:
        os.close(write)
        os.waitpid(child, 0)
    with workdir_hold.hold(work):
        pass


def test_a_work_dir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(HookrunError, match="exists and is not a folder"), workdir_hold.hold(path):
        pass


@pytest.mark.parametrize("below", [False, True])
def test_a_checkpoint_out_dir_that_is_a_file_is_refused_up_front(toy, tmp_path, below):
    """``plugins.checkpoint.out_dir`` naming a file, or a folder below one, is checked as
    ``runner.work_dir`` is: one line naming the setting from ``config validate`` and from
    ``train``, before anything trains or is created."""
    afile = tmp_path / "afile"
    afile.write_text("mine")
    out_dir = afile / "ck" if below else afile
    setting = ("--set", f"plugins.checkpoint.out_dir={out_dir}")
    expected = (
        f"plugins.checkpoint.out_dir: cannot create {out_dir}: {afile} is a file, not a folder"
        if below
        else f"plugins.checkpoint.out_dir: {afile} exists and is not a folder"
    )
    checked = hookrun("config", "validate", toy, *setting)
    assert checked.returncode == 2 and checked.stderr.strip() == expected, checked.stderr
    work = tmp_path / "run"
    done = hookrun("train", toy, "--work-dir", work, *setting)
    assert done.returncode == 2 and done.stderr.strip() == expected, done.stderr
    assert not work.exists() and afile.read_text() == "mine"


# -- fresh, failed start, trained ----------------------------------------------------------


def _jsonl(work: Path, *records: dict) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_failed_start_leftovers_judges_logs_event_files_and_checkpoints(tmp_path):
    work = tmp_path / "run"
    ckpts = [work / "checkpoints"]

    def judged():
        return workdir.failed_start_leftovers(work, run_resume.checkpoint_leftovers(ckpts))

    _jsonl(work, {"config": {}})
    (work / "config.yaml").write_text("task: x\n")
    (work / "notes.txt").write_text("mine")
    writer = TensorBoardWriter(work)
    writer.write_config({"a": 1})
    writer.close()
    found = judged()
    assert found is not None
    assert sorted(p.relative_to(work).parts[0] for p in found) == ["log.jsonl", "tensorboard"]

    trained = TensorBoardWriter(work)
    trained.write_scalars({"train/loss": 1.0}, 1)
    trained.close()
    assert judged() is None  # a scalar: it trained
    for events in (work / "tensorboard").iterdir():
        events.unlink()

    jsonl = JsonlWriter(work)
    jsonl.write_scalars({"train/loss": 1.0}, 1)
    jsonl.close()
    assert judged() is None  # a logged step
    (work / "log.jsonl").write_text("{torn\n")
    assert judged() is None  # cannot be judged
    _jsonl(work, {"config": {}})

    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "iter_4.pt").write_bytes(b"not a checkpoint")
    assert judged() is None


# -- a finished run ------------------------------------------------------------------------


def test_resume_auto_on_a_finished_run_changes_nothing(toy, tmp_path, capsys):
    work = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", toy, "--work-dir", work)  # in-process: a setup
    assert code == 0, err
    assert (work / workdir.FINISHED_NAME).is_file()
    before = snapshot(work)
    lines = len((work / "log.jsonl").read_text().splitlines())

    again = hookrun("train", toy, "--work-dir", work, "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "[hookrun] building task toytask.py:build ...",
        f"run in {work} is already finished (iteration 8 of 8); nothing to do",
    ]
    assert snapshot(work) == before  # no validation, no test, no point, no config rewritten
    assert len((work / "log.jsonl").read_text().splitlines()) == lines

    # what `hookrun train` decides, asked in-process
    runner = launch.build_runner(cfg.load(toy, [], work))
    assert run_resume.finished_position(runner) is not None
    longer = launch.build_runner(cfg.load(toy, ["runner.max_epochs=3"], work))
    assert run_resume.finished_position(longer) is None  # more to train: it resumes
    marker = (work / workdir.FINISHED_NAME).read_text()
    (work / workdir.FINISHED_NAME).unlink()  # as after a stop during the final validation
    assert run_resume.finished_position(runner) is None  # it validates and tests on resume
    (work / workdir.FINISHED_NAME).write_text(marker)
    (work / "checkpoints" / "latest").unlink()
    (work / "checkpoints" / "epoch_2.pt").unlink()  # the newest left is epoch_1.pt
    assert run_resume.finished_position(runner) is None


# -- where checkpoints are -------------------------------------------------------------------


def test_the_folder_the_checkpoint_plugin_declares_is_where_every_check_looks(toy, tmp_path):
    """``plugins.checkpoint.out_dir`` is the run's checkpoint folder from construction on: the
    saves go there, a new run is refused over it before its task is built, and
    ``--resume auto`` finds a finished run, and then a checkpoint, there."""
    work = tmp_path / "run"
    here = ("--set", "plugins.checkpoint.out_dir=saved", "--set", "runner.writers=[]")
    first = hookrun("train", toy, "--work-dir", work, *here)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (work / "saved").iterdir()) == [
        "epoch_1.pt",
        "epoch_2.pt",
        "latest",
    ]
    assert not (work / "checkpoints").exists()
    assert not list(work.glob("*.jsonl"))  # the checkpoints are the only sign that it trained

    before = snapshot(work)
    again = hookrun("train", toy, "--work-dir", work, *here)
    assert again.returncode == 2
    assert again.stderr.strip() == (
        f"work dir {work} already holds a run; continue it with `--resume auto`, "
        "or start a new one with another `--work-dir` (or delete the folder)"
    )
    assert "building task" not in again.stdout  # refused before the task is built
    assert snapshot(work) == before

    done = hookrun("train", toy, "--work-dir", work, "--resume", "auto", *here)
    assert done.returncode == 0, done.stderr
    assert f"run in {work} is already finished (iteration 8 of 8)" in done.stdout
    assert snapshot(work) == before

    runner = launch.build_runner(cfg.load(toy, ["plugins.checkpoint.out_dir=saved"], work))
    assert runner.checkpoint_dir == work / "saved"
    (work / workdir.FINISHED_NAME).unlink()  # as after a stop during the final validation
    resumed = hookrun("train", toy, "--work-dir", work, "--resume", "auto", *here)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {work / 'saved' / 'epoch_2.pt'} at iteration 8" in resumed.stdout


def test_writers_are_given_the_run_s_checkpoint_folder(tmp_path):
    class Folder(Writer):
        """Remembers where a tracker would look for the run's checkpoints."""

        def write_scalars(self, scalars, step):
            self.seen = self.run_checkpoint_dir

    recorder = Folder(tmp_path / "run")
    assert recorder.run_checkpoint_dir == tmp_path / "run" / "checkpoints"  # alone: the default
    plugins = {"checkpoint": {"out_dir": str(tmp_path / "elsewhere")}}
    runner = Runner(**toy_runner_kwargs(tmp_path, plugins=plugins, writers=[recorder]))
    runner.train()
    assert recorder.seen == runner.checkpoint_dir == tmp_path / "elsewhere"
    assert (tmp_path / "elsewhere" / "epoch_2.pt").is_file()


# -- files of yours in a work dir ------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.yaml", "log.jsonl"])
@pytest.mark.parametrize("resume", [None, "auto"])
def test_a_start_never_writes_over_a_file_hookrun_did_not_write(toy, tmp_path, name, resume):
    """``work_dir: .`` in a folder holding your own commented ``config.yaml`` (the config
    run, here): refused in one line naming the file, before anything is written, with or
    without ``--resume auto`` (which finds nothing to continue: a fresh start)."""
    work = tmp_path / "proj"
    work.mkdir()
    (work / "toytask.py").write_text((toy.parent / "toytask.py").read_text())
    mine = work / name
    text = "# my own, with comments\n" + toy.read_text()
    mine.write_text(text if name == "config.yaml" else '{"note": "my own log"}\n')
    config = work / "config.yaml" if name == "config.yaml" else toy
    before = snapshot(work)
    args = ("--resume", resume) if resume else ()
    done = hookrun("train", config, "--work-dir", work, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"{mine} exists and is not a file hookrun wrote (.hookrun.files does not list it); "
        "this run would write over it: move it away, or use another --work-dir"
    )
    assert snapshot(work) == before  # no lock file left either


def test_resuming_another_run_s_checkpoint_into_a_used_work_dir_is_refused(toy, tmp_path, capsys):
    """An explicit ``--resume PATH`` from outside the work dir continues only where no run
    is: a folder holding files named like checkpoints that hookrun did not write, or another
    run, is left as it was; an empty one takes it, and the source run is not touched."""
    done, other = tmp_path / "done", tmp_path / "other"
    for work, seed in ((done, 0), (other, 7)):
        code, _, err = run_cli(
            capsys, "train", toy, "--work-dir", work, "--set", f"runner.seed={seed}"
        )
        assert code == 0, err
    source = done / "checkpoints" / "epoch_1.pt"
    yours = tmp_path / "yours"
    (yours / "checkpoints").mkdir(parents=True)
    (yours / "checkpoints" / "epoch_1.pt").write_text("my notes")
    (yours / "checkpoints" / "best_loss.pt").write_text("my notes 2")
    kept = snapshot(done)
    longer = ("--set", "runner.max_epochs=4", "--set", "plugins.checkpoint.max_keep=1")
    for work in (yours, other):
        before = snapshot(work)
        refused = hookrun("train", toy, "--work-dir", work, "--resume", source, *longer)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip() == (
            f"--resume {source}: a checkpoint from outside work dir {work} continues only in "
            f"a work dir that holds no run, so that it trains over none: work dir {work} "
            "already holds a run; continue it with `--resume auto`, or start a new one with "
            "another `--work-dir` (or delete the folder)"
        )
        assert snapshot(work) == before
    fresh = tmp_path / "fresh"
    resumed = hookrun("train", toy, "--work-dir", fresh, "--resume", source, *longer)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {source} at iteration 4" in resumed.stdout
    assert sorted(p.name for p in (fresh / "checkpoints").iterdir()) == ["epoch_4.pt", "latest"]
    assert snapshot(done) == kept


def test_a_checkpoint_file_hookrun_did_not_write_is_never_written_over(toy, tmp_path, capsys):
    """A file of yours named like the next checkpoint in the run's own folder: the resume
    skips it, and the save that would replace it is refused in one line; the file stays."""
    work = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", toy, "--work-dir", work)
    assert code == 0, err
    mine = work / "checkpoints" / "epoch_3.pt"
    mine.write_text("my notes")
    done = hookrun(
        "train", toy, "--work-dir", work, "--resume", "auto", "--set", "runner.max_epochs=3"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"checkpoint: will not write over {mine}: hookrun did not write it (.hookrun.files "
        "does not list it); move it away and resume with `--resume auto`"
    )
    assert mine.read_text() == "my notes"
    assert (work / "checkpoints" / "latest").read_text() == "epoch_2.pt\n"

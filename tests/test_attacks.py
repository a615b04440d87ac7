"""Attacks on a work dir, and ordinary mistakes that looked like them: nothing of the user's is
lost, overwritten or trained over, and no input makes hookrun hang. Each case ends harmless
or in one line with exit code 2 (a ``HookrunError`` from the API); files are compared by
their hashes before and after. Real ``python -m hookrun`` processes, with a timeout, where a
hang is the failure."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from hookrun import hookimpl
from hookrun.checkpoint import resume as run_resume
from hookrun.cli import prepare as launch
from hookrun.config import file as cfg
from hookrun.engine import workdir, workdir_hold
from hookrun.engine.runner import Runner
from hookrun.errors import HookrunError, WorkDirBusyError
from hookrun.testing import forked, isolated_env, run_cli, toy_runner_kwargs

TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build(width=2, optimizer="sgd", batch_size=8, n=32, fail=False):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))
    model = nn.Linear(4, width)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if fail:
        model.forward = explode
    return {
        "model": model,
        "train_dataloader": DataLoader(data, batch_size=batch_size),
        "val_dataloader": DataLoader(data, batch_size=8),
        "criterion": nn.CrossEntropyLoss(),
        "metrics": {"accuracy": lambda out, y: (out.argmax(1) == y).float().mean()},
        "optimizer": opt,
    }


def explode(x):
    raise ValueError("user code broke here")
"""

CONFIG = """\
task: attacktask.py:build
runner: {max_epochs: 2, device: cpu, writers: [jsonl, tensorboard]}
plugins: {checkpoint: {save_best: accuracy}, logger: false, timer: false}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "attacktask.py").write_text(TASK)
    path = tmp_path / "attack.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def thesis(tmp_path: Path) -> Path:
    """A file of the user's outside every work dir."""
    path = tmp_path / "thesis.tex"
    path.write_text("\\chapter{Results}\nMonths of work.\n")
    return path


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links not followed) by its SHA-256."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line(code: int, out: str, err: str) -> str:
    """The refusal's line: exit code 2, one line on stderr, no traceback."""
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def hookrun(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A real ``python -m hookrun`` process; a hang fails the test after ``timeout``."""
    env = isolated_env({k: v for k, v in os.environ.items() if k != "RANK"})
    command = [sys.executable, "-m", "hookrun", *map(str, args)]
    return forked.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def trained(capsys: pytest.CaptureFixture[str], config: Path, work: Path, *sets: str) -> None:
    """Train the attack task for 2 epochs into ``work`` (checkpoints epoch_1, epoch_2, best)."""
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work, *args)
    assert code == 0, (out, err)


# -- 1. resume auto never trains over a run ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "first_mismatch"),
    [
        ("task_args.width=3", "model: 2 size mismatches, first: weight [2,4] (checkpoint)"),
        ("task_args.optimizer=adam", "optimizer: SGD state cannot restore Adam"),
    ],
)
def test_resume_auto_refuses_checkpoints_none_of_which_fits(
    capsys, config, tmp_path, change, first_mismatch
):
    work = tmp_path / "run"
    trained(capsys, config, work)
    before = digests(work)
    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", work, "--resume", "auto", "--set", change
    )
    line = one_line(code, out, err)
    assert "resume auto: no checkpoint in" in line and "starting fresh would write over" in line
    newest = (work / "checkpoints" / "latest").read_text().strip()
    assert f"the newest, {newest}, does not fit this run: {first_mismatch}" in line
    assert digests(work) == before  # every old file byte-identical, nothing new

    # the Python API refuses the same way, before its writers open
    runner = launch.build_runner(cfg.load(config, [change], work))
    with pytest.raises(HookrunError, match=f"the newest, {newest}, does not fit this run"):
        runner.train(resume="auto")
    assert digests(work) == before


# -- 2. the lock holds within a process; a used work dir needs a resume --------------------


class Gate:
    """Holds a run in ``before_train`` until released (at most a minute)."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    @hookimpl
    def before_train(self, runner: object) -> None:
        self.entered.set()
        self.go.wait(60)


def test_a_second_train_in_another_thread_is_refused_and_a_used_work_dir_needs_resume(
    tmp_path,
):
    gate = Gate()
    writers = {"writers": ("jsonl",), "plugins": {"checkpoint": True}}
    first = Runner(**toy_runner_kwargs(tmp_path, hooks=[gate], **writers))
    failures: list[BaseException] = []

    def train() -> None:
        try:
            first.train()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=train, name="first-run")
    thread.start()
    try:
        assert gate.entered.wait(60)
        work = tmp_path / "run"
        before = digests(work)
        second = Runner(**toy_runner_kwargs(tmp_path, **writers))
        refused: list[BaseException] = []
        other = threading.Thread(target=lambda: _capture(second.train, refused))
        other.start()
        other.join(60)
        assert len(refused) == 1 and isinstance(refused[0], WorkDirBusyError)
        assert str(refused[0]) == (
            f"work dir {work} is in use by another run of this process (thread first-run); "
            "wait for it or use another work_dir"
        )
        assert digests(work) == before  # the first run's iter files and log untouched
    finally:
        gate.go.set()
        thread.join(60)
    assert not failures

    # the first run is over: its work dir holds a run, and a start without resume is refused
    before = digests(work)
    again = Runner(**toy_runner_kwargs(tmp_path, **writers))
    with pytest.raises(HookrunError, match=f"work dir {work} already holds a run"):
        again.train()
    assert digests(work) == before
    again.train(resume="auto")  # continuing it is what the message offers


def _capture(call: object, into: list[BaseException]) -> None:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:
        into.append(exc)


# -- 3. a file of the user's is never removed ----------------------------------------------


def test_the_users_own_files_survive_every_start_failed_start_and_restart(capsys, config, tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    data = work / "train.jsonl"  # the user's data set, named like a log
    data.write_text("".join(json.dumps({"step": i, "text": f"s{i}"}) + "\n" for i in range(5)))
    notes = work / "notes\nwith a newline.txt"
    notes.write_text("mine")
    long_name = work / ("n" * 240 + ".jsonl")
    long_name.write_text('{"config": {}}\n')
    mine = {p: digest(p) for p in (data, notes, long_name)}

    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", work, "--set", "task_args.fail=true"
    )
    assert code == 1 and "user code broke here" in err
    assert (work / "checkpoints" / "emergency_iter_0.pt").is_file()
    assert {p: digest(p) for p in mine} == mine

    trained(capsys, config, work)  # starts over: removes only what hookrun recorded
    out = capsys.readouterr().out
    assert {p: digest(p) for p in mine} == mine
    assert not (work / "checkpoints" / "emergency_iter_0.pt").exists()
    recorded = workdir_hold.recorded(work)
    assert work / "log.jsonl" in recorded and data not in recorded

    code, out, err = run_cli(capsys, "train", config, "--work-dir", work)  # a restart
    assert f"work dir {work} already holds a run" in one_line(code, out, err)
    assert {p: digest(p) for p in mine} == mine


def test_leftovers_hookrun_cannot_prove_it_wrote_are_left(tmp_path):
    work = tmp_path / "run"
    (work / "checkpoints").mkdir(parents=True)
    (work / "log.jsonl").write_text('{"config": {}}\n')  # no manifest lists it
    leftovers = run_resume.check_unused(work, [work / "checkpoints"])
    assert leftovers == [work / "log.jsonl"]
    line = workdir.start_over(work, leftovers)
    assert line is not None and "left log.jsonl: not recorded as written by hookrun" in line
    assert (work / "log.jsonl").read_text() == '{"config": {}}\n'


# -- 4. no planted link is followed, no hard-linked file written ---------------------------


@pytest.mark.parametrize(
    "planted", [workdir_hold.LOCK_NAME, "log.jsonl", workdir_hold.MANIFEST_NAME, "config.yaml"]
)
@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_planted_link_changes_nothing_outside(capsys, config, tmp_path, thesis, planted, kind):
    work = tmp_path / "run"
    work.mkdir()
    if kind == "symlink":
        (work / planted).symlink_to(Path("..") / thesis.name)
    else:
        os.link(thesis, work / planted)
    before = digest(thesis)
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work)
    assert digest(thesis) == before
    line = one_line(code, out, err)  # a config.yaml hookrun did not write is not replaced
    assert str(work / planted) in line or f"work dir {work} already holds a run" in line


def test_a_linked_tensorboard_folder_is_refused(capsys, config, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    work = tmp_path / "run"
    work.mkdir()
    (work / "tensorboard").symlink_to(outside)
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work)
    assert "is a symbolic link" in one_line(code, out, err)
    assert list(outside.iterdir()) == []


# -- 5. every refusing check before anything is written ------------------------------------


@pytest.mark.parametrize("resume", ["auto", "explicit"])
def test_sgd_to_adam_is_refused_before_the_record_changes(capsys, config, tmp_path, resume):
    work = tmp_path / "run"
    trained(capsys, config, work)
    before = digests(work)
    path = "auto" if resume == "auto" else work / "checkpoints" / "epoch_1.pt"
    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", work, "--resume", path,
        "--set", "task_args.optimizer=adam", "--set", "runner.max_epochs=3",
    )  # fmt: skip
    line = one_line(code, out, err)
    assert "optimizer: SGD state cannot restore Adam" in line
    assert digests(work) == before  # config.yaml and log.jsonl byte-identical


# -- 6. an empty train loader --------------------------------------------------------------


def test_an_empty_train_loader_leaves_no_work_dir(capsys, config, tmp_path):
    work = tmp_path / "new" / "run"
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work, "--set", "task_args.n=0")
    assert one_line(code, out, err).endswith("train_dataloader: yields no batches")
    assert not (tmp_path / "new").exists()

    checkpoints = {"checkpoint": True}
    runner = Runner(**toy_runner_kwargs(tmp_path, train_dataloader=[], plugins=checkpoints))
    with pytest.raises(HookrunError, match="train_dataloader: yields no batches"):
        runner.train()
    assert not (tmp_path / "run").exists()  # no emergency checkpoint of an untrained model


# -- 7. FIFOs and devices where hookrun reads ----------------------------------------------


def test_a_fifo_given_to_resume_is_one_line_not_a_hang(config, tmp_path):
    fifo = tmp_path / "ckpt.pt"
    os.mkfifo(fifo)
    done = hookrun("train", config, "--work-dir", tmp_path / "run", "--resume", fifo, timeout=90)
    line = one_line(done.returncode, done.stdout, done.stderr)
    assert line.endswith(f"cannot load checkpoint {fifo}: not a regular file (a FIFO)")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_given_to_resume_is_one_line(capsys, config, tmp_path, device):
    code, out, err = run_cli(
        capsys, "train", config, "--work-dir", tmp_path / "run", "--resume", device
    )
    assert "not a regular file (a character device)" in one_line(code, out, err)
    assert not (tmp_path / "run").exists()


def test_fifos_and_devices_among_the_checkpoints_are_skipped_under_auto(capsys, config, tmp_path):
    work = tmp_path / "run"
    trained(capsys, config, work)
    best = work / "checkpoints" / "best_accuracy.pt"
    best.unlink()
    os.mkfifo(best)
    (work / "checkpoints" / "iter_99.pt").symlink_to("/dev/zero")
    done = hookrun(
        "train", config, "--work-dir", work, "--resume", "auto", "--set", "runner.max_epochs=3",
        timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"skipping {best}: not a regular file (a FIFO)" in done.stdout
    assert "iter_99.pt: not a regular file (a character device)" in done.stdout
    assert "resumed from" in done.stdout and "epoch_2.pt" in done.stdout
    assert (work / "checkpoints" / "epoch_3.pt").is_file()


# -- 8. a resume position beyond this run's epoch ------------------------------------------


def test_a_position_beyond_the_new_epoch_is_refused(tmp_path):
    every_6 = {"checkpoint": {"by_epoch": False, "interval": 6}}
    kwargs = toy_runner_kwargs(tmp_path, max_iters=8, max_epochs=None, plugins=every_6)
    kwargs["train_dataloader"] = _loader(batch_size=4)  # 8 batches an epoch
    Runner(**kwargs).train()
    path = tmp_path / "run" / "checkpoints" / "iter_6.pt"
    loop = torch.load(path, weights_only=True)["loop"]
    assert (loop["batch"], loop["phase"]) == (6, "train")  # mid-epoch

    wider = toy_runner_kwargs(tmp_path / "b", max_iters=8, max_epochs=None)
    wider["train_dataloader"] = _loader(batch_size=8)  # 4 batches an epoch
    with pytest.raises(HookrunError) as refused:
        Runner(**wider).train(resume=path)
    assert "loop: the checkpoint is at batch 6 of epoch 1 and an epoch of this run has 4" in str(
        refused.value
    )
    assert not (tmp_path / "b" / "run").exists()


def _loader(batch_size: int) -> torch.utils.data.DataLoader:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    return DataLoader(data, batch_size=batch_size)


# -- odd sizes and names of checkpoint files -----------------------------------------------


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda raw: b"", "the file is empty (0 bytes)"),
        (lambda raw: raw[: len(raw) // 3], "damaged, or not a torch.save file"),
    ],
    ids=["zero bytes", "truncated"],
)
def test_a_damaged_checkpoint_given_to_resume_is_one_line(capsys, config, tmp_path, damage, reason):
    work = tmp_path / "run"
    trained(capsys, config, work)
    bad = tmp_path / ("x" * 200 + ".pt")  # a long name too
    bad.write_bytes(damage((work / "checkpoints" / "epoch_1.pt").read_bytes()))
    before = digests(work)
    code, out, err = run_cli(capsys, "train", config, "--work-dir", work, "--resume", bad)
    assert f"cannot load checkpoint {bad}: {reason}" in one_line(code, out, err)
    assert digests(work) == before


@pytest.mark.parametrize("name", [workdir_hold.LOCK_NAME, "log.jsonl", workdir.FINISHED_NAME])
def test_a_fifo_where_hookrun_writes_or_reads_its_own_files_is_one_line(config, tmp_path, name):
    work = tmp_path / "run"
    work.mkdir()
    os.mkfifo(work / name)
    done = hookrun("train", config, "--work-dir", work, "--resume", "auto", timeout=90)
    line = one_line(done.returncode, done.stdout, done.stderr)  # not hookrun's: not replaced
    assert str(work / name) in line and "FIFO" in line

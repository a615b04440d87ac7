"""``hookrun train CONFIG --smoke`` through real ``hookrun`` processes, and the debugging
limits it rests on (``limit_train_batches``, ``limit_val_batches``) through the Python API."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from _support import DIGITS, run, write
from hookrun import hookimpl
from hookrun.testing import toy_data


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_smoke_runs_the_digits_config_and_leaves_its_work_dir_alone(tmp_path: Path) -> None:
    # the config's work dir (runs/digits, relative to the current folder) holds a run already
    work = tmp_path / "runs" / "digits"
    write(work / "log.jsonl", '{"step": 1, "train/loss": 2.0}\n')
    write(work / "checkpoints" / "latest", "epoch_1.pt\n")
    before = tree(work)
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = run("train", DIGITS, "--smoke", cwd=tmp_path, TMPDIR=str(temp))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "epoch 1/1  iter 2/2" in out  # one epoch of two batches
    assert "val  epoch 1  iter 2  loss " in out and "test  iter 2  loss " in out
    # the config's plugins ran: precise-BN's pass, the checkpoint plugin's saves
    assert "precise_bn: recomputed" in out and "checkpoint: saved epoch_1.pt" in out
    assert "smoke run passed" in out
    assert tree(work) == before  # nothing in the config's work dir changed
    used = out.split("its work dir ")[1].split(" is removed")[0]
    assert Path(used).parent == temp and Path(used).name.startswith("hookrun-smoke-")
    assert not Path(used).exists()  # the temporary work dir is removed


def test_smoke_config_mistake_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    config = write(
        tmp_path / "bad.yaml",
        f"""\
        task: {DIGITS.parent / "task.py"}:build
        runner: {{max_epochs: 2, work_dir: {tmp_path / "out"}, val_intervall: 1}}
        """,
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = run("train", config, "--smoke", cwd=tmp_path, TMPDIR=str(temp))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "runner.val_intervall" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() and not list(temp.glob("hookrun-smoke-*"))


@pytest.mark.parametrize("option", [["--resume", "auto"], ["--work-dir", "elsewhere"]])
def test_smoke_refuses_options_for_a_real_run(tmp_path: Path, option: list[str]) -> None:
    proc = run("train", DIGITS, "--smoke", *option, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"--smoke: a smoke run starts afresh in a temporary work dir; leave out {option[0]}"
    )
    assert list(tmp_path.iterdir()) == []


# -- the limits ----------------------------------------------------------------------------


class Batches:
    """Ad-hoc hook: the batches each training epoch and each evaluation saw."""

    def __init__(self) -> None:
        self.train: list[list[torch.Tensor]] = []
        self.val: list[list[torch.Tensor]] = []

    @hookimpl
    def before_train_epoch(self) -> None:
        self.train.append([])

    @hookimpl
    def after_train_iter(self, batch: Any) -> None:
        self.train[-1].append(batch[0])

    @hookimpl
    def before_val_epoch(self) -> None:
        self.val.append([])

    @hookimpl
    def after_val_iter(self, batch: Any) -> None:
        self.val[-1].append(batch[0])


def test_limits_cut_each_epoch_and_each_set(make_toy_runner: Any) -> None:
    seen = Batches()
    sets = {"a": toy_data(12, 4, shuffle=False, seed=1), "b": toy_data(8, 4, shuffle=False, seed=2)}
    runner = make_toy_runner(
        hooks=[seen], val_dataloader=sets, limit_train_batches=2, limit_val_batches=1
    )
    assert runner.max_iters == 4  # 2 epochs of 2 batches (of 3)
    runner.train()
    assert [len(epoch) for epoch in seen.train] == [2, 2]
    assert runner.iter == 4
    # each validation: the first batch of each set, and metrics of that batch only
    firsts = [next(iter(loader))[0] for loader in sets.values()]
    assert len(seen.val) == 2
    for batches in seen.val:
        assert len(batches) == 2
        assert all(torch.equal(got, want) for got, want in zip(batches, firsts, strict=True))
    model = runner.unwrapped_model
    for name, loader in sets.items():
        x, y = next(iter(loader))
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        assert runner.last_metrics["val"][f"{name}/accuracy"] == pytest.approx(accuracy)


def test_limits_above_the_length_change_nothing(make_toy_runner: Any) -> None:
    runner = make_toy_runner(limit_train_batches=10, limit_val_batches=10)
    assert runner.max_iters == 6
    runner.train()
    assert runner.iter == 6

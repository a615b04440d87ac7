"""Nothing read from a checkpoint is trusted: ``resume="auto"`` skips, one named line each,
every file that does not load or does not fit (the runner untouched by it), never resumes
from weights that are not finite, ignores a garbage ``latest`` pointer; an explicit file
that does not fit is one line naming it, before anything changes."""

from __future__ import annotations

import copy
import os
import pickle
import random
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hookrun import Runner
from hookrun.checkpoint import files as ckpt_io
from hookrun.checkpoint import resume as run_resume
from hookrun.errors import CheckpointError, CheckpointMismatchError, HookrunError
from hookrun.testing import assert_states_equal, toy_model, toy_runner_kwargs

# -- a run with one good checkpoint ----------------------------------------------------------


def make_runner(tmp_path: Path, **overrides: Any) -> Runner:
    """The toy task (``nn.Linear(4, 2)``, SGD with momentum, so the optimizer has state)."""
    model = toy_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    kwargs = toy_runner_kwargs(tmp_path, model=model, optimizer=optimizer, max_epochs=1)
    kwargs.update(overrides)
    return Runner(**kwargs)


def trained_checkpoint(tmp_path: Path, name: str = "iter_3.pt") -> Path:
    """One epoch (3 iterations) of the toy task, saved in the run's checkpoint folder."""
    runner = make_runner(tmp_path)
    runner.train()
    return runner.save_checkpoint(runner.checkpoint_dir / name)


def snapshot(runner: Runner) -> dict[str, Any]:
    """Everything restoring a checkpoint could change (clones, not references)."""
    return {
        "model": {k: v.clone() for k, v in runner.unwrapped_model.state_dict().items()},
        "optimizer": copy.deepcopy(runner.optimizer.state_dict()),
        "loop": runner.position.state_dict(),
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": torch.from_numpy(np.random.get_state(legacy=True)[1].astype(np.int64)),
    }


def newer(path: Path, seconds: int = 10) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + seconds * 10**9))


# -- the damage variants ---------------------------------------------------------------------


class Evil:
    """Pickles as a call of ``os.system``: what a malicious checkpoint holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def edited(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any], Path], None]:
    def make(good: dict[str, Any], path: Path) -> None:
        state = pickle.loads(pickle.dumps(good))
        change(state)
        torch.save(state, path)

    return make


def raw(data: Callable[[bytes, Path], bytes]) -> Callable[[dict[str, Any], Path], None]:
    def make(good: dict[str, Any], path: Path) -> None:
        buffer = path.with_suffix(".tmp")
        torch.save(good, buffer)
        path.write_bytes(data(buffer.read_bytes(), path))
        buffer.unlink()

    return make


def foreign_zip(good: dict[str, Any], path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")


def malicious(good: dict[str, Any], path: Path) -> None:
    torch.save({**good, "model": Evil(path.parent.parent / "PWNED")}, path)


def two_groups(state: dict[str, Any]) -> None:
    state["optimizers"]["main"]["param_groups"] = [
        {**state["optimizers"]["main"]["param_groups"][0], "params": [0]},
        {**state["optimizers"]["main"]["param_groups"][0], "params": [1]},
    ]


DAMAGE: dict[str, tuple[Callable[[dict[str, Any], Path], None], str]] = {
    "truncated": (
        raw(lambda data, _: data[: len(data) // 2]),
        "cannot be loaded: damaged, or not a torch.save file (",
    ),
    "zero bytes": (raw(lambda data, _: b""), "cannot be loaded: the file is empty (0 bytes)"),
    "random bytes": (
        raw(lambda data, _: random.Random(0).randbytes(len(data))),
        "cannot be loaded: not a hookrun checkpoint (weights_only load refused: ",
    ),
    "plain pickle": (
        raw(lambda data, _: pickle.dumps({"format": "hookrun/1", "model": {}})),
        "cannot be loaded: not a hookrun checkpoint (weights_only load refused: Unsupported",
    ),
    "foreign zip": (
        foreign_zip,
        "cannot be loaded: damaged, or not a torch.save file (file in archive is not in a "
        "subdirectory: notes.txt)",
    ),
    "torch.save of a list": (
        lambda good, path: torch.save([1, 2], path),
        "cannot be loaded: not a hookrun checkpoint (it holds a list, not a dict)",
    ),
    "dict without format": (
        edited(lambda s: s.pop("format")),
        "cannot be loaded: not a hookrun checkpoint (a dict without 'format'; keys: meta, ",
    ),
    "another format": (
        edited(lambda s: s.update(format="hookrun/9")),
        "cannot be loaded: format 'hookrun/9' is not 'hookrun/1'",
    ),
    "no model": (
        edited(lambda s: s.pop("model")),
        "does not fit this run: no 'model' entry (not a complete checkpoint)",
    ),
    "no rng": (
        edited(lambda s: s.pop("rng")),
        "does not fit this run: no 'rng' entry (saved with weights only?)",
    ),
    "no loop": (
        edited(lambda s: s.pop("loop")),
        "does not fit this run: no 'loop' entry (saved with weights only?)",
    ),
    "another width": (
        edited(lambda s: s.update(model=nn.Linear(4, 3).state_dict())),
        "does not fit this run: model: 2 size mismatches, first: weight [3,4] (checkpoint) "
        "vs [2,4] (model)",
    ),
    "missing model key": (
        edited(lambda s: s["model"].pop("bias")),
        "does not fit this run: model: 1 missing key, first: bias",
    ),
    "unexpected model key": (
        edited(lambda s: s["model"].update(scale=torch.ones(1), shift=torch.ones(1))),
        "does not fit this run: model: 2 unexpected keys, first: scale",
    ),
    "optimizer groups": (
        edited(two_groups),
        "does not fit this run: optimizer: 2 parameter groups in the checkpoint, 1 in the "
        "optimizer",
    ),
    "optimizer sizes": (
        edited(lambda s: s["optimizers"]["main"]["param_groups"][0].update(params=[0, 1, 2])),
        "does not fit this run: optimizer: parameter group 0 has 3 parameters in the "
        "checkpoint, 2 in the optimizer",
    ),
    "optimizer state shape": (
        edited(
            lambda s: s["optimizers"]["main"]["state"][0].update(momentum_buffer=torch.zeros(5))
        ),
        "does not fit this run: optimizer: 1 state mismatch, first: momentum_buffer of "
        "parameter 0 [5] (checkpoint) vs [2,4] (parameter)",
    ),
    "rng of the wrong size": (
        edited(lambda s: s["rng"].update(torch=torch.zeros(100, dtype=torch.uint8))),
        f"does not fit this run: rng: torch state has 100 bytes, not "
        f"{torch.get_rng_state().numel()}",
    ),
    "rng garbage": (
        edited(lambda s: s["rng"].update(torch="garbage")),
        "does not fit this run: rng: torch state is a str, not a uint8 tensor",
    ),
    "python rng short": (
        edited(lambda s: s["rng"]["python"].update(state=torch.arange(10))),
        "does not fit this run: rng: python state has 10 values, not 625",
    ),
    "numpy rng short": (
        edited(lambda s: s["rng"]["numpy"].update(key=torch.arange(3))),
        "does not fit this run: rng: numpy key has 3 values, not 624",
    ),
    "loop phase x": (
        edited(lambda s: s["loop"].update(phase="x")),
        "does not fit this run: loop: not a position (ValueError: 'x' is not a valid Phase)",
    ),
    "loop negative": (
        edited(lambda s: s["loop"].update(epoch=-1, iter=-5)),
        "does not fit this run: loop: negative position (epoch=-1, iter=-5)",
    ),
    "malicious pickle": (
        malicious,
        "cannot be loaded: not a hookrun checkpoint (weights_only load refused: Trying to "
        "load unsupported GLOBAL posix.system whose module posix is blocked)",
    ),
}


@pytest.mark.parametrize("variant", list(DAMAGE))
def test_auto_skips_each_damaged_file_naming_it_and_leaves_the_runner_untouched(
    tmp_path, capsys, variant
):
    make, reason = DAMAGE[variant]
    good = trained_checkpoint(tmp_path)
    folder = good.parent
    damaged = folder / "iter_9.pt"
    make(torch.load(good, weights_only=True), damaged)
    newer(damaged)
    moved = good.rename(tmp_path / "aside.pt")
    capsys.readouterr()

    # the damaged file alone: named, and refused rather than trained over (a fresh start
    # would write its files over it); nothing of the runner changed
    runner = make_runner(tmp_path)
    before = snapshot(runner)
    with pytest.raises(CheckpointMismatchError) as refused:
        run_resume.resume_auto(runner)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(f"[hookrun] skipping checkpoint {damaged}: {reason}")
    assert str(refused.value).startswith(
        f"resume auto: no checkpoint in {folder} can continue this run, and starting fresh "
        f"would write over them; the newest, iter_9.pt, {reason}"
    )
    assert_states_equal(snapshot(runner), before)
    assert not (tmp_path / "PWNED").exists()

    # beside an older good file: that one is chosen, and said why
    moved.rename(good)
    assert run_resume.resume_auto(runner) == good
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"[hookrun] skipping checkpoint {damaged}: {reason}")
    assert out[1:] == [
        f"[hookrun] resumed from {good} at iteration 3 (newest that loads and fits; skipped 1)"
    ]
    saved = torch.load(good, weights_only=True)
    assert_states_equal(runner.unwrapped_model.state_dict(), saved["model"])
    assert runner.position.state_dict() == saved["loop"]
    assert not (tmp_path / "PWNED").exists()


def test_auto_never_resumes_from_weights_that_are_not_finite(tmp_path, capsys):
    good = trained_checkpoint(tmp_path, "epoch_1.pt")
    state = torch.load(good, weights_only=True)
    state["model"]["weight"][0, 0] = float("nan")
    state["model"]["bias"][1] = float("inf")
    emergency = good.parent / "emergency_iter_5.pt"
    torch.save(state, emergency)
    newer(emergency)
    capsys.readouterr()

    runner = make_runner(tmp_path)
    assert run_resume.resume_auto(runner) == good
    out = capsys.readouterr().out
    assert (
        f"[hookrun] skipping checkpoint {emergency}: weights are not finite (nan in weight and "
        "1 more tensor)\n" in out
    )
    assert f"resumed from {good} at iteration 3 (newest that loads and fits; skipped 1)" in out

    # only non-finite files: refused, one line; an explicit path takes it with a warning
    good.unlink()
    runner = make_runner(tmp_path)
    before = snapshot(runner)
    with pytest.raises(CheckpointMismatchError) as refused:
        runner.train(resume="auto")
    assert str(refused.value) == (
        f"resume auto: every checkpoint in {good.parent} that fits this run has weights that "
        "are not finite (newest: emergency_iter_5.pt); name one explicitly to resume from it "
        "anyway, or start a new run"
    )
    assert_states_equal(snapshot(runner), before)
    capsys.readouterr()
    runner.load_checkpoint(emergency)
    assert (
        f"warning: checkpoint {emergency} holds weights that are not finite (nan in weight"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe\x00\x9f garbage", "it is not text"),
        (b"../victim.pt\n", "'../victim.pt' is not a plain file name"),
        (b"sub/iter_3.pt", "'sub/iter_3.pt' is not a plain file name"),
        (b"VICTIM\n", "'{victim}' is not a plain file name"),
        (b"nope.pt\n", "'nope.pt' is not a checkpoint here"),
        (b"..\n", "'..' is not a plain file name"),
        (b"\n", "it is empty"),
    ],
)
def test_a_garbage_latest_pointer_is_ignored_with_a_notice(tmp_path, capsys, content, why):
    older = trained_checkpoint(tmp_path, "iter_2.pt")
    newest = older.with_name("iter_3.pt")
    newest.write_bytes(older.read_bytes())
    newer(newest)
    victim = tmp_path / "run" / "victim.pt"  # loads and fits, but lies outside the folder
    victim.write_bytes(older.read_bytes())
    newer(victim, 20)
    content = content.replace(b"VICTIM", str(victim).encode())
    (older.parent / "latest").write_bytes(content)
    capsys.readouterr()

    runner = make_runner(tmp_path)
    assert run_resume.resume_auto(runner) == newest
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"[hookrun] ignoring {older.parent / 'latest'}: {why.format(victim=victim)}",
        f"[hookrun] resumed from {newest} at iteration 3 (newest that loads and fits)",
    ]


def test_a_valid_latest_pointer_goes_first_and_is_named(tmp_path, capsys):
    older = trained_checkpoint(tmp_path, "iter_2.pt")
    newest = older.with_name("iter_3.pt")
    newest.write_bytes(older.read_bytes())
    newer(newest)
    (older.parent / "latest").write_text("iter_2.pt\n")
    capsys.readouterr()
    assert run_resume.resume_auto(make_runner(tmp_path)) == older
    latest = older.parent / "latest"
    assert f"resumed from {older} at iteration 3 (named by {latest})" in capsys.readouterr().out


# -- an explicit file ------------------------------------------------------------------------


def test_an_explicit_file_that_does_not_fit_is_one_line_and_changes_nothing(tmp_path):
    wide = make_runner(tmp_path / "wide", model=nn.Linear(4, 3))
    path = wide.save_checkpoint(tmp_path / "wide.pt")
    runner = make_runner(tmp_path)
    before = snapshot(runner)
    for resume in (True, False):
        with pytest.raises(CheckpointMismatchError) as error:
            runner.load_checkpoint(path, resume=resume)
        assert error.value.lines == [
            f"checkpoint {path} does not fit this run: model: 2 size mismatches, first: "
            "weight [3,4] (checkpoint) vs [2,4] (model)"
        ]
    assert_states_equal(snapshot(runner), before)

    # weights that fit, an optimizer that does not: the weights are not loaded either
    state = torch.load(path, weights_only=True)
    state["model"] = runner.unwrapped_model.state_dict()
    state["model"] = {k: v + 1 for k, v in state["model"].items()}
    state["optimizers"]["main"]["param_groups"][0]["params"] = [0]
    torch.save(state, path)
    with pytest.raises(CheckpointMismatchError, match="parameter group 0 has 1 parameter in"):
        runner.train(resume=path)
    assert_states_equal(snapshot(runner), before)
    runner.load_checkpoint(path, resume=False)  # the weights alone fit
    assert torch.equal(runner.unwrapped_model.bias, before["model"]["bias"] + 1)


def test_a_plugin_refusing_its_state_leaves_the_run_untouched(tmp_path, capsys):
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def state_dict(self) -> dict[str, Any]:
            return {"count": self.count}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.count = int(state["count"])

    class Picky(Counter):
        def load_state_dict(self, state: dict[str, Any]) -> None:
            raise KeyError("level")

    first, picky = Counter(), Picky()
    runner = make_runner(tmp_path, hooks=[first, picky])
    runner.train()
    first.count = 7
    path = runner.save_checkpoint(runner.checkpoint_dir / "iter_3.pt")
    first.count = 0
    fresh = make_runner(tmp_path, hooks=[first, picky])
    before = snapshot(fresh)
    with pytest.raises(CheckpointMismatchError) as error:
        fresh.load_checkpoint(path)
    assert str(error.value).startswith(f"cannot restore checkpoint {path}: plugins.")
    assert "its state does not load (KeyError: 'level')" in str(error.value)
    assert first.count == 0  # put back
    assert_states_equal(snapshot(fresh), before)
    capsys.readouterr()
    with pytest.raises(CheckpointMismatchError, match="no checkpoint in .* can continue"):
        run_resume.resume_auto(fresh)  # nothing else to resume from, and no fresh start over it
    assert f"skipping checkpoint {path}: plugins." in capsys.readouterr().out


# -- errors ----------------------------------------------------------------------------------


def test_the_error_taxonomy():
    # a checkpoint the user named that does not fit is the user's to fix (exit 2); a failed
    # write is a runtime failure (exit 1), not a user mistake
    assert issubclass(CheckpointMismatchError, HookrunError)
    assert not issubclass(CheckpointError, HookrunError)


def test_load_errors_are_one_line(tmp_path):
    path = tmp_path / "evil.pt"
    malicious({"format": "hookrun/1"}, path)
    with pytest.raises(CheckpointMismatchError) as error:
        ckpt_io.load(path)
    assert error.value.lines == [
        f"cannot load checkpoint {path}: not a hookrun checkpoint (weights_only load refused: "
        "Trying to load unsupported GLOBAL posix.system whose module posix is blocked)"
    ]
    assert not (tmp_path / "PWNED").exists()


# -- files the checkpoint plugin did not write -----------------------------------------------


def test_the_checkpoint_plugin_deletes_and_replaces_only_files_hookrun_wrote_there(
    tmp_path, capsys
):
    """In a work dir, rotation deletes a file its record releases only when hookrun's record
    of the work dir lists it, and a save never replaces a file it does not list; outside
    every work dir held (no record to ask) the plugin's own record decides, as on a store."""
    from hookrun_checkpoint.storage import LocalStorage
    from hookrun_checkpoint.writing import refuse_overwrite, write_files

    from hookrun.engine import workdir_hold

    work = tmp_path / "run"
    folder = work / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "epoch_1.pt").write_text("my notes")  # yours, named like a checkpoint
    storage = LocalStorage(folder)

    def write(state: Any, path: Path) -> None:
        ckpt_io.atomic_write_text(state, path)

    with workdir_hold.hold(work):
        write_files(storage, write, "2", ["epoch_2.pt"], [])
        with pytest.raises(HookrunError, match=f"will not write over {folder / 'epoch_1.pt'}"):
            refuse_overwrite(storage, ["epoch_1.pt"])
        refuse_overwrite(storage, ["epoch_2.pt"])  # its own: replaced as before
        write_files(storage, write, "3", ["epoch_3.pt"], ["epoch_1.pt", "epoch_2.pt"])
    assert (folder / "epoch_1.pt").read_text() == "my notes"
    assert not (folder / "epoch_2.pt").exists()
    assert f"keeping {folder / 'epoch_1.pt'}: hookrun did not write it" in capsys.readouterr().err

    write_files(storage, write, "4", ["epoch_4.pt"], ["epoch_3.pt"])  # no work dir held
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_1.pt", "epoch_4.pt", "latest"]

"""Which files exist, what they hold, and what happens when writing fails (in-process)."""

from __future__ import annotations

import errno
import io
import os
import signal
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hookrun_checkpoint import HostCopy

from hookrun import CheckpointError, ConfigError, PluginError, hookimpl
from hookrun.testing import load_checkpoint


def tensors(obj: Any, prefix: str = "") -> Any:
    """Every tensor of a nested checkpoint, by path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, (dict, list, tuple)):
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, value in items:
            yield from tensors(value, f"{prefix}/{key}")


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def plugin_state(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)["plugins"]["checkpoint"]


def test_keep_one_keeps_resumed_from_and_best_across_resumes(make_runner: Callable) -> None:
    settings = {"max_keep": 1, "save_best": "accuracy"}
    scores = (0.5, 0.9, 0.6, 0.7, 0.8, 0.95)
    runner = make_runner(settings, scores)
    runner.train()
    out = runner.checkpoint_dir
    assert files(out) == {"epoch_3.pt", "best_accuracy.pt", "latest"}
    best = torch.load(out / "best_accuracy.pt", weights_only=True)
    assert best["meta"]["epoch"] == 2

    runner = make_runner(settings, scores, max_epochs=5)
    runner.train(resume="auto")
    assert runner.resumed_from == out / "epoch_3.pt"
    # epoch_4 went when epoch_5 came; epoch_3 stays (resumed from, not counted); 0.7 and 0.8
    # did not beat the 0.9 kept in the bookkeeping, so best_accuracy.pt is still epoch 2's
    assert files(out) == {"epoch_3.pt", "epoch_5.pt", "best_accuracy.pt", "latest"}
    assert torch.load(out / "best_accuracy.pt", weights_only=True)["meta"]["epoch"] == 2
    assert (out / "latest").read_text() == "epoch_5.pt\n"
    state = plugin_state(out / "epoch_5.pt")
    assert state["kept"] == ["epoch_3.pt", "epoch_5.pt"]
    assert state["best"]["accuracy"]["score"] == pytest.approx(0.9)

    runner = make_runner(settings, scores, max_epochs=6)
    runner.train(resume="auto")
    assert runner.resumed_from == out / "epoch_5.pt"
    # a later run protects its own resume point; epoch_3 is rotated out now; 0.95 is a new best
    assert files(out) == {"epoch_5.pt", "epoch_6.pt", "best_accuracy.pt", "latest"}
    assert torch.load(out / "best_accuracy.pt", weights_only=True)["meta"]["epoch"] == 6
    assert (out / "latest").read_text() == "best_accuracy.pt\n"


def test_rule_less_and_iteration_files(make_runner: Callable) -> None:
    runner = make_runner(
        {"by_epoch": False, "interval": 5, "save_best": ["accuracy"], "rule": "less"},
        scores=(0.5, 0.9, 0.4),
    )
    runner.train()
    out = runner.checkpoint_dir
    # 12 iterations: every 5th, then the last one (save_last); the least accuracy is epoch 3's
    assert files(out) == {"iter_5.pt", "iter_10.pt", "iter_12.pt", "best_accuracy.pt", "latest"}
    assert torch.load(out / "best_accuracy.pt", weights_only=True)["meta"]["epoch"] == 3


def test_truncated_newest_checkpoint_is_skipped_by_name(make_runner: Callable) -> None:
    runner = make_runner({"by_epoch": False, "interval": 2}, max_epochs=2)
    runner.train()
    out = runner.checkpoint_dir
    newest = out / "iter_8.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    runner = make_runner({"by_epoch": False, "interval": 2}, max_epochs=2)
    runner.train(resume="auto")
    console = runner.console.file.getvalue()
    assert f"skipping checkpoint {newest}: cannot be loaded" in console
    assert runner.resumed_from == out / "iter_6.pt"
    assert load_checkpoint(newest)["meta"]["iter"] == 8  # written again, whole
    assert (out / "latest").read_text() == "iter_8.pt\n"


def fail_third_save(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third torch.save writes half its bytes, then the disk is full."""
    real_save, calls = torch.save, []

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) < 3:
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_write_stops_with_one_line_and_keeps_older_files(
    make_runner: Callable, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    runner = make_runner({"async_save": async_save})
    out = runner.checkpoint_dir
    fail_third_save(monkeypatch)
    with pytest.raises(CheckpointError) as failure:
        runner.train()
    assert str(failure.value) == (
        f"cannot write checkpoint {out / 'epoch_3.pt'}: No space left on device"
    )
    monkeypatch.undo()
    assert files(out) == {"epoch_1.pt", "epoch_2.pt", "latest"}  # no temp file, no emergency
    assert (out / "latest").read_text() == "epoch_2.pt\n"
    assert load_checkpoint(out / "epoch_2.pt")["meta"]["epoch"] == 2
    assert load_checkpoint(out / "epoch_1.pt")["meta"]["epoch"] == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_stops_training_and_keeps_older_files(make_runner: Callable) -> None:
    class LockFolder:
        priority = 100  # after the checkpoint plugin

        @hookimpl
        def after_train_epoch(self, runner: Any) -> None:
            runner.checkpoint_dir.chmod(0o555)

    runner = make_runner(hooks=[LockFolder()])
    out = runner.checkpoint_dir
    try:
        with pytest.raises(CheckpointError, match=f"cannot write checkpoint {out / 'epoch_2.pt'}"):
            runner.train()
    finally:
        out.chmod(0o755)
    assert files(out) == {"epoch_1.pt", "latest"}
    assert load_checkpoint(out / "epoch_1.pt")["meta"]["epoch"] == 1


def without_time(obj: Any) -> Any:
    """The checkpoint with tensors and the save time left out."""
    if isinstance(obj, dict):
        return {k: without_time(v) for k, v in obj.items() if k != "time"}
    if isinstance(obj, (list, tuple)):
        return [without_time(v) for v in obj]
    return None if isinstance(obj, torch.Tensor) else obj


def test_async_save_writes_the_same_files(tmp_path: Path, make_runner: Callable) -> None:
    settings = {"by_epoch": False, "interval": 2, "save_best": "auto"}
    sync = make_runner(settings, work_dir=tmp_path / "sync")
    sync.train()
    background = make_runner({**settings, "async_save": True}, work_dir=tmp_path / "async")
    background.train()
    names = files(sync.checkpoint_dir)
    assert names == files(background.checkpoint_dir)
    assert len(names) == 8  # iter_2 ... iter_12, best_accuracy.pt, latest
    for name in names - {"latest"}:
        left = torch.load(sync.checkpoint_dir / name, weights_only=True)
        right = torch.load(background.checkpoint_dir / name, weights_only=True)
        assert without_time(left) == without_time(right)
        right_tensors = dict(tensors(right))
        for key, value in tensors(left):
            assert torch.equal(value, right_tensors[key]), (name, key)


def test_host_copy_keeps_shared_storage_and_metadata() -> None:
    weight = torch.randn(4, 3)
    state = OrderedDict(a=weight, tied=weight, row=weight[1], step=torch.tensor(3), n=[1, (2,)])
    state._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]
    original, duplicate = io.BytesIO(), io.BytesIO()
    torch.save({"model": state}, original)
    copied = HostCopy().copy({"model": state})
    weight.add_(1)  # a later training step does not reach the copy
    torch.save(copied, duplicate)
    assert (
        copied["model"]["tied"].untyped_storage()._cdata
        == copied["model"]["a"].untyped_storage()._cdata
    )
    # byte for byte but for the random serialization id torch.save adds
    assert strip_id(duplicate.getvalue()) == strip_id(original.getvalue())
    assert copied["model"]._metadata == {"": {"version": 1}}


def strip_id(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {n: archive.read(n) for n in archive.namelist() if "serialization_id" not in n}


class Raiser:
    """Raises in the forward pass of iteration ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        if runner.iter == self.at:
            raise RuntimeError("loss is NaN")


@pytest.mark.parametrize("enabled", [True, False])
def test_emergency_checkpoint_on_exception(make_runner: Callable, enabled: bool) -> None:
    runner = make_runner({"save_on_exception": enabled}, hooks=[Raiser(5)])
    with pytest.raises(RuntimeError, match="loss is NaN"):
        runner.train()
    out = runner.checkpoint_dir
    if not enabled:
        assert files(out) == {"epoch_1.pt", "latest"}
        return
    assert files(out) == {"epoch_1.pt", "emergency_iter_5.pt", "latest"}
    assert (out / "latest").read_text() == "emergency_iter_5.pt\n"
    emergency = load_checkpoint(out / "emergency_iter_5.pt")
    assert emergency["meta"]["iter"] == 5 and emergency["loop"]["batch"] == 1


class Terminator:
    """Sends this process SIGTERM during iteration ``at`` and records the handler in force."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.handler_during_run: Any = None

    @hookimpl
    def before_train_iter(self, runner: Any) -> None:
        self.handler_during_run = signal.getsignal(signal.SIGTERM)
        if runner.iter == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_handler_is_for_the_run_only_and_the_signal_is_passed_on(
    make_runner: Callable, capsys: pytest.CaptureFixture[str]
) -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        terminator = Terminator(5)
        runner = make_runner(hooks=[terminator])
        mine = signal.getsignal(signal.SIGTERM)
        runner.train()
        assert signal.getsignal(signal.SIGTERM) is mine  # put back after the run
        assert terminator.handler_during_run is not mine
    finally:
        signal.signal(signal.SIGTERM, previous)
    # iteration 5 finished, was saved, training stopped, then the run's own handler got it
    assert received == [signal.SIGTERM]
    assert runner.iter == 6
    out = runner.checkpoint_dir
    assert files(out) == {"epoch_1.pt", "iter_6.pt", "latest"}
    assert load_checkpoint(out / "iter_6.pt")["loop"] == {
        "epoch": 1,
        "batch": 2,
        "phase": "train",
        "iter": 6,
        "optimizer_steps": {"main": 6},  # one step per iteration (no accumulation)
    }
    assert f"SIGTERM received: saved {out / 'iter_6.pt'}; stopping" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        (
            {"interval": 0},
            "plugins.checkpoint.interval: Input should be greater than or equal to 1",
        ),
        (
            {"max_keep": 0},
            "plugins.checkpoint.max_keep: Input should be greater than or equal to 1",
        ),
        (
            {"rule": "bigger"},
            "plugins.checkpoint.rule: Input should be 'greater', 'less' or 'auto'",
        ),
        (
            {"save_best": "bleh"},
            "plugins.checkpoint.rule: cannot tell from the metric name 'bleh'",
        ),
        ({"save_best": []}, "plugins.checkpoint.save_best: give at least one metric"),
        ({"keep": 3}, "plugins.checkpoint.keep: unknown setting"),
    ],
)
def test_invalid_settings_name_the_field(make_runner: Callable, settings: dict, line: str) -> None:
    with pytest.raises(PluginError) as error:
        make_runner(settings)
    assert str(error.value).startswith(line)


def test_rule_auto_reads_names() -> None:
    from hookrun import metric_rule

    assert [metric_rule(n) for n in ("val_loss", "top1_error", "accuracy", "mIoU", "foo")] == [
        "less",
        "less",
        "greater",
        "greater",
        None,
    ]


def test_missing_best_metric_is_a_config_error(make_runner: Callable) -> None:
    runner = make_runner({"save_best": "top1"})
    with pytest.raises(ConfigError, match="save_best: validation reports no metric 'top1'"):
        runner.train()

"""What a user sees when a checkpoint write fails or a named checkpoint does not fit: the
original error (a full disk, Ctrl-C) rather than torch's ``inline_container.cc`` wrapper,
one line and the right exit code from ``python -m hookrun``, the previous files intact, and
files created with the user's umask."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hookrun import Runner
from hookrun.checkpoint import files as ckpt_io
from hookrun.errors import CheckpointError
from hookrun.testing import forked, isolated_env, toy_runner_kwargs, write_toy_task

# -- writes ----------------------------------------------------------------------------------


def python(code: str, *args: object, **popen: Any) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter; its last stdout line is returned parsed as JSON."""
    return forked.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=isolated_env(),
        **popen,
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_full_disk_names_the_file_and_the_os_error_and_keeps_every_older_file(tmp_path):
    # A real "disk full": writes past RLIMIT_FSIZE fail with OSError(EFBIG) (SIGXFSZ ignored).
    # Portable: no mount needed (test_full_disk fills a real 3 MB tmpfs where mounting works).
    proc = python(
        """
        import json, resource, signal, sys
        from pathlib import Path
        import torch
        from hookrun.checkpoint import files as ckpt_io
        from hookrun.errors import CheckpointError

        out = Path(sys.argv[1])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
        for i in (1, 2):
            state = {"format": "hookrun/1", "x": torch.full((1000,), float(i))}
            ckpt_io.write(state, out / f"iter_{i}.pt")
        big = {"format": "hookrun/1", "x": torch.zeros(2**18)}  # 1 MiB
        result = {}
        for name in ("iter_3.pt", "iter_2.pt"):  # a new file, and one replacing an older
            try:
                ckpt_io.write(big, out / name)
            except CheckpointError as exc:
                cause = exc.__cause__
                result[name] = [str(exc), type(cause).__name__, getattr(cause, "errno", None)]
        result["files"] = sorted(p.name for p in out.iterdir())
        result["old"] = [ckpt_io.load(out / f"iter_{i}.pt")["x"][0].item() for i in (1, 2)]
        print(json.dumps(result))
        """,
        tmp_path,
    )
    result = last_json(proc)
    for name in ("iter_3.pt", "iter_2.pt"):
        assert result[name] == [
            f"cannot write checkpoint {tmp_path / name}: File too large",
            "OSError",
            errno.EFBIG,
        ]
    assert result["files"] == ["iter_1.pt", "iter_2.pt"]  # no temporary file left behind
    assert result["old"] == [1.0, 2.0]


def test_a_real_sigint_during_a_write_is_a_keyboard_interrupt(tmp_path):
    # SIGINT sent while the temporary file grows: torch.save's zip writer would turn the
    # KeyboardInterrupt raised in write() into "RuntimeError: [enforce fail at ...]"
    proc = python(
        """
        import json, os, signal, sys, threading, time
        from pathlib import Path
        import torch
        from hookrun.checkpoint import files as ckpt_io

        out = Path(sys.argv[1])
        ckpt_io.write({"format": "hookrun/1", "x": torch.ones(10)}, out / "iter_1.pt")
        big = {"format": "hookrun/1", "x": torch.zeros(32 * 2**20)}  # 128 MiB

        def interrupt_mid_write():
            while True:
                for tmp in out.glob(".*.tmp"):
                    try:
                        if tmp.stat().st_size > 2**20:
                            os.kill(os.getpid(), signal.SIGINT)
                            return
                    except FileNotFoundError:
                        pass
                time.sleep(0.0005)

        threading.Thread(target=interrupt_mid_write, daemon=True).start()
        try:
            ckpt_io.write(big, out / "iter_1.pt")
            raised = None
        except BaseException as exc:
            raised = type(exc).__name__
        files = sorted(p.name for p in out.iterdir())
        print(json.dumps([raised, files, ckpt_io.load(out / "iter_1.pt")["x"].sum().item()]))
        """,
        tmp_path,
    )
    assert last_json(proc) == ["KeyboardInterrupt", ["iter_1.pt"], 10.0]


class FailingFile:
    """A file whose third ``write`` raises ``error``."""

    def __init__(self, f: Any, error: BaseException) -> None:
        self.f, self.error, self.calls = f, error, 0

    def write(self, data: Any) -> int:
        self.calls += 1
        if self.calls == 3:
            raise self.error
        return int(self.f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")]
)
def test_the_original_error_of_a_failed_write_surfaces(tmp_path, monkeypatch, error):
    path = tmp_path / "epoch_1.pt"
    ckpt_io.write({"format": "hookrun/1", "x": torch.ones(3)}, path)
    fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: FailingFile(fdopen(fd, mode), error))
    big = {"format": "hookrun/1", "x": torch.zeros(1000), "y": torch.zeros(1000)}
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            ckpt_io.write(big, path)
    else:
        with pytest.raises(CheckpointError) as failed:
            ckpt_io.write(big, path)
        assert str(failed.value) == f"cannot write checkpoint {path}: No space left on device"
        assert failed.value.__cause__ is error
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["epoch_1.pt"]
    assert torch.equal(ckpt_io.load(path)["x"], torch.ones(3))


def test_files_are_created_with_the_users_umask(tmp_path):
    proc = python(
        """
        import json, os, sys
        from pathlib import Path
        import torch
        from hookrun.checkpoint import files as ckpt_io

        out, modes = Path(sys.argv[1]), {}
        for umask in (0o022, 0o027, 0o077):
            os.umask(umask)
            path = ckpt_io.write({"format": "hookrun/1"}, out / f"{umask:o}.pt")
            ckpt_io.atomic_write_text(path.name, out / f"latest_{umask:o}")
            modes[f"{umask:o}"] = [
                oct(path.stat().st_mode & 0o777),
                oct((out / f"latest_{umask:o}").stat().st_mode & 0o777),
            ]
        print(json.dumps(modes))
        """,
        tmp_path,
    )
    assert last_json(proc) == {
        "22": ["0o644", "0o644"],
        "27": ["0o640", "0o640"],
        "77": ["0o600", "0o600"],
    }


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_toy_task(
        tmp_path,
        """
        task: toytask.py:build
        runner: {max_epochs: 1, device: cpu, writers: [jsonl]}
        plugins: {checkpoint: true, logger: false, timer: false}
        """,
    )


class Evil:
    """Pickles as a call of ``os.system``: what a malicious checkpoint holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def hookrun(*args: object, **popen: Any) -> subprocess.Popen[str]:
    """``python -m hookrun ARGS``, started (several run side by side)."""
    return forked.spawn(
        [sys.executable, "-m", "hookrun", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=isolated_env(),
        **popen,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def test_a_named_checkpoint_that_does_not_fit_is_one_line_and_exit_2(tmp_path, config):
    wide = Runner(**toy_runner_kwargs(tmp_path / "wide", model=nn.Linear(4, 3)))
    wide_pt = wide.save_checkpoint(tmp_path / "wide.pt")
    evil = tmp_path / "evil.pt"
    torch.save({"format": "hookrun/1", "model": Evil(tmp_path / "PWNED")}, evil)
    runs = {
        "val": hookrun("val", config, "--checkpoint", wide_pt, "--work-dir", tmp_path / "v"),
        "test": hookrun("test", config, "--checkpoint", evil, "--work-dir", tmp_path / "t"),
        "train": hookrun("train", config, "--resume", wide_pt, "--work-dir", tmp_path / "r"),
    }
    results = {name: finish(proc) for name, proc in runs.items()}
    mismatch = (
        f"checkpoint {wide_pt} does not fit this run: model: 2 size mismatches, first: "
        "weight [3,4] (checkpoint) vs [2,4] (model)\n"
    )
    building = "[hookrun] building task toytask.py:build ...\n"
    assert results["val"] == (2, building, mismatch)
    assert results["train"] == (2, building, mismatch)
    assert results["test"][:2] == (2, building)
    assert results["test"][2].startswith(
        f"cannot load checkpoint {evil}: not a hookrun checkpoint (weights_only load refused: "
    )
    assert results["test"][2].count("\n") == 1
    # nothing created: no folder, lock file, config.yaml or log
    assert not any((tmp_path / name).exists() for name in ("v", "t", "r"))
    assert not (tmp_path / "PWNED").exists()


def test_a_full_disk_during_training_is_one_line_and_exit_1(tmp_path, config):
    work = tmp_path / "run"
    width = ("--set", "task_args.width=30000")  # a 600 KB checkpoint
    first = hookrun("train", config, "--work-dir", work, *width, preexec_fn=lambda: os.umask(0o027))
    code, out, err = finish(first)
    assert code == 0, err
    folder = work / "checkpoints"
    assert oct(os.stat(folder / "epoch_1.pt").st_mode & 0o777) == "0o640"  # the user's umask

    def full_disk() -> None:  # writes past 512 KiB fail with EFBIG (see the test above)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, 512 * 1024))

    more = ("--resume", "auto", "--set", "runner.max_epochs=2")
    resumed = hookrun("train", config, "--work-dir", work, *width, *more, preexec_fn=full_disk)
    code, out, err = finish(resumed)
    assert code == 1
    assert err == f"error: cannot write checkpoint {folder / 'epoch_2.pt'}: File too large\n"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch_1.pt", "latest"]
    assert (folder / "latest").read_text().strip() == "epoch_1.pt"
    assert ckpt_io.load(folder / "epoch_1.pt")["meta"]["epoch"] == 1

"""``hookrun.testing.forked``: a job forked from the server is the process the interpreter
would have started — the same output, exit status and signals as ``subprocess`` gives for
the same command — and what a fork cannot reproduce runs as a real ``Popen``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hookrun.testing import forked

JOB = """\
import os, sys, tempfile
print(__name__, sys.argv[1:], os.getcwd(), os.environ.get("PROBE"), sys.path[0] == "{first}")
print(tempfile.gettempdir())
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[-1]))
"""


@pytest.mark.parametrize("form", ["script", "-c", "-m"])
def test_a_job_prints_and_exits_as_the_interpreter_would(tmp_path: Path, form: str) -> None:
    first = {"script": str(tmp_path), "-c": "", "-m": str(tmp_path)}[form]
    (tmp_path / "probe.py").write_text(JOB.format(first=first))
    command = {
        "script": [sys.executable, str(tmp_path / "probe.py")],
        "-c": [sys.executable, "-c", JOB.format(first=first)],
        "-m": [sys.executable, "-m", "probe"],
    }[form] + ["a b", "3"]
    env = dict(os.environ, PROBE="yes", TMPDIR=str(tmp_path))
    options = dict(cwd=tmp_path, env=env, capture_output=True, text=True)
    real = subprocess.run(command, **options)  # type: ignore[call-overload]
    fork = forked.run(command, **options)
    assert (fork.returncode, fork.stdout, fork.stderr) == (
        real.returncode,
        real.stdout,
        real.stderr,
    )
    assert (
        fork.returncode == 3
        and "__main__ ['a b', '3']" in fork.stdout
        and "yes True" in fork.stdout
    )


def test_uncaught_errors_and_ctrl_c_end_as_they_would(tmp_path: Path) -> None:
    """A traceback and exit 1; Ctrl-C's traceback, then death by SIGINT."""
    for code, status in (("raise ValueError('bad')", 1), ("raise KeyboardInterrupt", -2)):
        fork = forked.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert fork.returncode == status
        assert fork.stderr.startswith("Traceback") and fork.stderr.splitlines()[-1] in (
            "ValueError: bad",
            "KeyboardInterrupt",
        )


def test_pipes_sessions_and_signals(tmp_path: Path) -> None:
    """A job in its own session reads its stdin, writes as it goes, and a signal to its
    process group ends it with that signal."""
    code = (
        "import sys, time\nprint(sys.stdin.readline().upper(), end='', flush=True)\ntime.sleep(60)"
    )
    proc = forked.spawn(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert isinstance(proc, forked.Forked)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("hello\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "HELLO\n"
    assert proc.poll() is None
    assert os.getpgid(proc.pid) == proc.pid  # its own session and process group
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM


def test_what_a_fork_cannot_reproduce_runs_as_a_real_interpreter(tmp_path: Path) -> None:
    """Interpreter options, other programs and a changed PYTHONPATH are real Popens."""
    path_env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for command, env in (
        ([sys.executable, "-X", "importtime", "-c", "pass"], None),
        (["sh", "-c", "exit 4"], None),
        ([sys.executable, "-c", "import sys; print(sys.path[1])"], path_env),
    ):
        proc = forked.spawn(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert isinstance(proc, subprocess.Popen)
        out, _ = proc.communicate(timeout=60)
        if env is path_env:
            assert out.decode().strip() == str(tmp_path)
    assert forked.run(["sh", "-c", "exit 4"]).returncode == 4

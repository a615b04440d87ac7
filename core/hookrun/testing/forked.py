"""Subprocesses without the interpreter's start-up: Python jobs forked from a server that
has torch imported, as ``multiprocessing``'s forkserver does.

A test's ``python -m hookrun ...`` or ``python job.py ...`` pays about 2.5 s of CPU to start
(``import torch`` and ``torch._dynamo``, which the first optimizer imports) before it does
anything; the suite starts hundreds. :func:`spawn` hands such a command to a server (one per
test process, started on first use) that imported those libraries once; the server forks, and
the child runs the command exactly as the interpreter would (``-m`` module or script path,
``sys.argv``, ``sys.path[0]``, working folder, environment, standard streams, process group,
exit status, signals) in a real process of its own. hookrun itself is not preloaded: every
job imports it fresh, reading its environment and entry points as a new process does.

What a fork cannot reproduce falls back to a real ``subprocess.Popen``: interpreter options
(``-X importtime``, ``-u``), a command that is not Python, and an environment whose
``PYTHON*`` variables (``PYTHONPATH``, a ``sitecustomize`` on it, ``PYTHONWARNINGS``)
differ from the server's. Tests of start-up itself (import times, deferred imports) use
``subprocess`` directly.

The server is :mod:`hookrun.testing.fork_server`, run as a script.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("fork_server.py")
"""The server's script (stdlib and the libraries it preloads only)."""


class Forked:
    """A job forked by the server, with ``subprocess.Popen``'s interface: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``,
    ``terminate`` and ``stdin``/``stdout``/``stderr`` pipes (``subprocess.PIPE``)."""

    def __init__(
        self,
        args: Sequence[str],
        job: dict[str, Any],
        stdin: Any,
        stdout: Any,
        stderr: Any,
        text: bool,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self._buffer = b""
        ours: list[int] = []  # the ends this process keeps (pipes' other ends)
        child_in, self.stdin = _stream(stdin, 0, False, text, ours)
        child_out, self.stdout = _stream(stdout, 1, True, text, ours)
        if stderr == subprocess.STDOUT:
            child_err, self.stderr = child_out, None
        else:
            child_err, self.stderr = _stream(stderr, 2, True, text, ours)
        fds = [child_in, child_out, child_err]
        self._conn = _connect()
        try:  # the job and its streams in one message: descriptors travel with its bytes
            socket.send_fds(self._conn, [json.dumps(job).encode() + b"\n"], fds)
        finally:
            for fd in set(fds) - {0, 1, 2}:
                if fd not in ours:
                    os.close(fd)
        self.pid = int(self._message(None)["pid"])

    def _message(self, timeout: float | None) -> dict[str, Any]:
        """The server's next line for this job; TimeoutExpired when none came in ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):  # a zero timeout is a non-blocking read
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            if not chunk:
                raise RuntimeError(f"the fork server lost the job {self.args}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = int(self._message(timeout)["status"])
            self.returncode = os.waitstatus_to_exitcode(status)
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0)
        return None

    def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> tuple[Any, Any]:
        """Write ``input``, read the pipes to their end and wait, as ``Popen.communicate``."""
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[Any, list[Any]] = {}
        with selectors.DefaultSelector() as selector:
            for pipe in (self.stdout, self.stderr):
                if pipe is not None and not pipe.closed:
                    selector.register(pipe, selectors.EVENT_READ)
                    chunks[pipe] = []
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                for key, _ in selector.select(left):
                    pipe = key.fileobj
                    data = os.read(pipe.fileno(), 65536)  # type: ignore[union-attr]
                    if data:
                        chunks[pipe].append(data)
                    else:
                        selector.unregister(pipe)
        outputs: list[Any] = []
        for pipe in (self.stdout, self.stderr):
            if pipe is None:
                outputs.append(None)
                continue
            data = b"".join(chunks.get(pipe, []))
            outputs.append(data.decode() if isinstance(pipe, io.TextIOBase) else data)
            pipe.close()
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        self.wait(left)
        return outputs[0], outputs[1]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for pipe in (self.stdin, self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        self.wait()


def spawn(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    start_new_session: bool = False,
    **popen: Any,
) -> Forked | subprocess.Popen[Any]:
    """``subprocess.Popen(args, ...)`` for the arguments it takes (``-m MODULE``, ``-c CODE``,
    a script, the ``hookrun`` command after ``sys.executable``): a fork of the server when
    ``args`` is a Python job it can run (see the module), else a real ``Popen``, which also
    takes any other of ``Popen``'s options (``preexec_fn``: a fork cannot apply them)."""
    argv = [os.fspath(a) for a in args]
    full_env = dict(os.environ if env is None else env)
    job = None if popen else _job(argv, full_env)
    if job is None:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=full_env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            text=text,
            start_new_session=start_new_session,
            **popen,
        )
    job.update(cwd=os.path.abspath(cwd or os.getcwd()), env=full_env, new_session=start_new_session)
    return Forked(argv, job, stdin, stdout, stderr, text)


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    timeout: float | None = None,
    capture_output: bool = False,
    check: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through :func:`spawn`: the job's exit status and its output."""
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = spawn(args, **options)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


def _job(argv: list[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    """What the server runs for ``argv`` (``{"module": ...}`` or ``{"script": ...}`` with its
    arguments), or None when only a real interpreter can run it."""
    if _python_variables(env) != _SERVER.get("python", _python_variables(os.environ)):
        return None
    if not argv:
        return None
    if argv[0] == sys.executable:
        rest = argv[1:]
        if len(rest) >= 2 and rest[0] in ("-m", "-c"):
            return {"module" if rest[0] == "-m" else "code": rest[1], "argv": rest[2:]}
        if rest and not rest[0].startswith("-") and rest[0].endswith(".py"):
            return {"script": os.path.abspath(rest[0]), "argv": rest[1:]}
        return None
    beside = Path(sys.executable).parent / "hookrun"
    if argv[0] in (str(beside), "hookrun") and beside.exists():
        return {"console": str(beside), "argv": argv[1:]}
    return None


_SERVER: dict[str, Any] = {}


def _connect() -> socket.socket:
    """A connection to this process's server, started on first use (and again after a fork
    of this process: a server serves the process that started it)."""
    if _SERVER.get("pid") != os.getpid():
        folder = tempfile.mkdtemp(prefix="hookrun-forked-")
        path = os.path.join(folder, "socket")
        server = subprocess.Popen(
            [sys.executable, str(SERVER), path],
            stdin=subprocess.PIPE,  # the lifeline: the server ends when this process does
            stdout=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items()},
        )
        _SERVER.update(
            pid=os.getpid(), path=path, server=server, python=_python_variables(os.environ)
        )
        atexit.register(_stop, server, folder)
    path = _SERVER["path"]
    deadline = time.monotonic() + 300  # it imports torch before it listens: seconds, loaded
    while time.monotonic() < deadline:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except (FileNotFoundError, ConnectionRefusedError):
            connection.close()
            if _SERVER["server"].poll() is not None:
                raise RuntimeError("the fork server ended before it listened") from None
            time.sleep(0.05)
    raise RuntimeError("the fork server did not listen within 300 s")


def _python_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the interpreter reads at its start (``PYTHONPATH`` and the rest)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


def _stop(server: subprocess.Popen[bytes], folder: str) -> None:
    if server.stdin is not None:
        server.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(5)
    server.kill()
    shutil.rmtree(folder, ignore_errors=True)


def _stream(spec: Any, default: int, output: bool, text: bool, ours: list[int]) -> tuple[int, Any]:
    """The job's file descriptor for one standard stream, and this side's pipe end if any."""
    if spec is None:
        return default, None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        return fd, None
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        mine, theirs = (read, write) if output else (write, read)
        ours.append(mine)
        mode = ("r" if output else "w") + ("" if text else "b")
        return theirs, open(mine, mode)  # noqa: SIM115 - the caller's pipe, closed by it
    fd = spec if isinstance(spec, int) else spec.fileno()
    ours.append(fd)  # the caller's own file: not closed here
    return fd, None

"""The fork server of :mod:`hookrun.testing.forked`: ``python fork_server.py SOCKET`` imports
the libraries every hookrun job pays most for once, then forks a process for each job a
client sends and runs the command in it exactly as the interpreter would. It imports only the
standard library and :data:`PRELOAD` (never hookrun: every job imports it fresh).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

PRELOAD = ("torch", "torch._dynamo", "torch.optim", "numpy", "click", "pydantic", "rich", "yaml")
"""What the server imports once: the libraries every hookrun job imports and pays most for."""


def _serve(path: str) -> None:
    """Accept jobs until the lifeline (stdin) closes; each is forked twice: a waiter that
    reports the job's pid and exit status, and the job itself."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(sys.stdin, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is sys.stdin:
                    return
                connection, _ = listener.accept()
                _accept(connection, listener)


def _accept(connection: socket.socket, listener: socket.socket) -> None:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    while not data.endswith(b"\n"):
        chunk = connection.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    job = json.loads(data)
    if os.fork() == 0:  # the waiter
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid == 0:
            listener.close()
            connection.close()
            _run_job(job, fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"status": status}).encode() + b"\n")
        os._exit(0)
    for fd in fds:
        os.close(fd)
    connection.close()


def _run_job(job: dict[str, Any], fds: list[int]) -> None:
    """In the forked job: become the process the interpreter would have started, run the
    command, end as the interpreter would (exit status, uncaught exception, Ctrl-C)."""
    code = 1
    try:
        if job["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        for name in ("stdin", "stdout", "stderr"):  # what the interpreter set them to
            setattr(sys, f"__{name}__", getattr(sys, name))
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        tempfile.tempdir = None  # found from TMPDIR on first use: the job's, not the server's
        _thread_settings(job["env"])
        code = _run_command(job)
    finally:
        with contextlib.suppress(BaseException):
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's exit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_command(job: dict[str, Any]) -> int:
    import runpy

    try:
        if "module" in job:
            sys.argv = ["-m", *job["argv"]]
            sys.path.insert(0, job["cwd"])
            runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        elif "code" in job:
            sys.argv = ["-c", *job["argv"]]
            sys.path.insert(0, "")
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
        elif "script" in job:
            sys.argv = [job["script"], *job["argv"]]
            sys.path.insert(0, os.path.dirname(job["script"]))
            runpy.run_path(job["script"], run_name="__main__")
        else:  # the console script: what pip's launcher runs
            sys.argv = [job["console"], *job["argv"]]
            sys.path.insert(0, os.path.dirname(job["console"]))
            from hookrun.cli.commands import main

            main()
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:  # the interpreter ends by the signal after its traceback
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _thread_settings(env: Mapping[str, str]) -> None:
    """torch reads ``OMP_NUM_THREADS`` when it is imported, in the server: apply the job's."""
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


if __name__ == "__main__":
    sys.path.pop(0)  # this folder: its modules must not shadow a job's
    _serve(sys.argv[1])

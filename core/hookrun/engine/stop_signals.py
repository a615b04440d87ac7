"""Stop signals, owned by the core for one run: noted when they arrive, acted on at the next
iteration boundary (training or validation), agreed across ranks, then re-delivered so that
the process ends the way the signal would have ended it (128 + N).

A signal handler only notes the signal: stopping at a boundary is what makes the save taken
then consistent (the position it records is the one its weights belong to). A second SIGINT
is Ctrl-C pressed again: it raises ``KeyboardInterrupt`` at once.

Under torch.distributed every rank must stop at the same iteration, but the signal reaches
each rank at its own moment (or only one of them). The ranks agree at the training loop's
report points (every ``log_interval`` iterations and at epoch ends), in the one small
all-reduce the core makes there (:meth:`hookrun.engine.reporting.Reporter.agree_ranks`), none in the
iterations between.

A stop is bounded in time: a process that caught a signal and then completes no iteration
for ``dist_timeout`` seconds before acting on it (stuck in a step, a hook, a data loader; or,
under torch.distributed, a rank whose peers never reach the agreement) ends by the signal
then, with one line on stderr saying why no checkpoint was taken. Under torch.distributed it
also ends at once when a rank on its node has ended: the agreement can no longer come, and a
launcher tearing the job down (torchrun's SIGTERM after a rank died) does not wait for its
30-second grace.

A closed standard output (``hookrun train ... | head``, or ``| tee`` ended by the same
Ctrl-C) is a stop too: :class:`StdoutGuard` drops what is written after it and stops the run
as SIGPIPE would, so the command ends quietly with 128 + 13. The stop's own line goes to
stderr, where a closed pipe cannot lose it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from hookrun.distributed.cluster import rank_prefix

UNCATCHABLE = {"SIGKILL", "SIGSTOP"}
DEFAULT_STOP_SIGNALS = ("SIGTERM", "SIGINT")
WATCH_INTERVAL_S = 0.5  # how often the watchdog looks at the progress and the node's ranks
_INSTALLED: list[StopSignals] = []  # the stop signals of the run in progress, if any
_STDOUT_GONE = threading.Event()  # set once a StdoutGuard found its reader gone


def signal_name(raw: str) -> str:
    """``term``, ``TERM`` or ``SIGTERM`` as ``SIGTERM``; ValueError when it cannot be caught."""
    name = raw.upper() if raw.upper().startswith("SIG") else "SIG" + raw.upper()
    if name in UNCATCHABLE or name not in signal.Signals.__members__:
        raise ValueError(f"{raw!r} is not a signal this platform can catch")
    return name


class StopSignals:
    """The run's stop signals: installed by ``Runner.train`` and put back when it ends."""

    def __init__(self, names: Sequence[str]) -> None:
        self.numbers = [signal.Signals[signal_name(name)] for name in names]
        self.caught: int | None = None  # the first stop signal this process received
        self.agreed: int | None = None  # the stop every rank acts on (None: keep training)
        self.previous: dict[int, Any] = {}
        self.distributed = False  # then a caught signal only counts once the ranks agree
        self.timeout_s = 0.0
        self.progress: Callable[[], int] = lambda: 0
        self.peers: Mapping[int, int] = {}  # the other ranks on this node: rank to process id
        self.watch: threading.Event | None = None  # set: the watchdog stands down

    def install(
        self, world_size: int, timeout_s: float = 600.0, progress: Callable[[], int] = lambda: 0
    ) -> bool:
        """Note the signals from now on; False when not in the main thread (nothing done).
        ``timeout_s`` and ``progress`` (iterations done) are the watchdog's measures. Under
        torch.distributed every rank calls this together (one gather)."""
        self.caught = self.agreed = None
        self.timeout_s, self.progress = timeout_s, progress
        if not self.numbers:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        self.distributed = world_size > 1
        if self.distributed:
            from hookrun.distributed import process_group

            self.peers = process_group.node_peers()
        for number in self.numbers:
            self.previous[number] = signal.signal(number, self._note)
        _INSTALLED.append(self)
        if _STDOUT_GONE.is_set():  # the reader went away before the run started: stop at once
            self._note(signal.SIGPIPE, None)
        return True

    def _note(self, signum: int, _frame: Any) -> None:
        if self.caught == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without waiting for a boundary
        if self.caught is None:
            self.caught = signum
            if not self.distributed:
                self.agreed = signum
            self.watch = threading.Event()
            args = (signum, self.watch, self.progress())
            threading.Thread(target=self._watchdog, args=args, daemon=True).start()

    def _watchdog(self, signum: int, stand_down: threading.Event, last: int) -> None:
        """End the process by ``signum`` when the stop cannot be acted on at an iteration
        boundary: ``timeout_s`` passed without an iteration done, or (under
        torch.distributed) a rank of this node ended before the ranks agreed."""
        from hookrun.distributed import process_group

        since = time.monotonic()
        while not stand_down.wait(WATCH_INTERVAL_S):
            now = self.progress()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= self.timeout_s:
                self._end(signum, stand_down, f"no iteration ended in {self.timeout_s:g} s")
            gone = process_group.ended(self.peers)
            if gone:
                self._end(signum, stand_down, f"rank {gone[0]} has ended")

    def _end(self, signum: int, stand_down: threading.Event, why: str) -> None:
        """End the process by ``signum`` at once, with the one line that says why."""
        if stand_down.is_set():
            return
        name = signal.Signals(signum).name
        line = f"{rank_prefix()}hookrun: {name} received, {why}: ending without a checkpoint\n"
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, line.encode())  # not sys.stderr: the main thread may hold its lock
        os._exit(128 + signum)

    def saved(self, signum: int, path: object, main: bool) -> None:
        """Say on stderr (rank 0) that the stop was saved to ``path`` and training stops."""
        if main:
            name = signal.Signals(signum).name
            print(f"[hookrun] {name} received: saved {path}; stopping", file=sys.stderr, flush=True)

    def acting(self) -> None:
        """The training loop acts on the stop (it saves and ends): the watchdog stands down."""
        if self.watch is not None:
            self.watch.set()

    def settle(self, signum: int) -> None:
        """Under torch.distributed: the largest signal number any rank caught (0: none), as
        the ranks agreed at a report point; the first agreement stands."""
        if self.agreed is None and signum:
            self.agreed = signum
        if self.agreed is not None:
            self.acting()  # this rank reached the agreement: not hung

    def restore(self) -> dict[int, Any]:
        """Put the previous handlers back; returns them by signal number."""
        if self.watch is not None:
            self.watch.set()
            self.watch = None
        if self in _INSTALLED:
            _INSTALLED.remove(self)
        previous = {n: signal.SIG_DFL if h is None else h for n, h in self.previous.items()}
        for number, handler in previous.items():
            signal.signal(number, handler)
        self.previous = {}
        return previous

    def redeliver(self) -> None:
        """End the way the signal would have ended the process: its previous handler runs
        (Python's SIGINT handler raises ``KeyboardInterrupt``), or the default action ends the
        process with status 128 + N. A signal caught too late to stop training (under
        torch.distributed, after the last agreement) is re-delivered too. A signal the process
        started with ignored (a shell's ``cmd &`` ignores SIGINT) was a stop signal all the
        same, so a run cut short never returns normally: it raises what the signal's handler
        would have (``KeyboardInterrupt`` for SIGINT, ``SystemExit(128 + N)`` otherwise), which
        ends a command with 130 or 128 + N and leaves a caller's process (a notebook, a test
        worker) alive to handle it."""
        number = self.agreed or self.caught
        self.agreed = self.caught = None
        if number is None:
            return
        if signal.getsignal(number) == signal.SIG_IGN:
            if number == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + number)
        sys.stdout.flush()  # a default action ends the process without Python's cleanup
        sys.stderr.flush()
        signal.raise_signal(number)


class StdoutGuard:
    """``sys.stdout`` for a command whose reader may go away (``| head`` closing the pipe,
    ``| tee`` ended by the same Ctrl-C): the first write or flush that finds the pipe closed
    points the file descriptor at ``os.devnull`` (Python's last flush stays quiet), drops
    everything after it and stops a training run in progress as SIGPIPE would (one that
    starts later stops at its first iteration boundary); ``closed_pipe`` says it happened.
    Everything else goes to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.closed_pipe = False
        """Whether the reader went away."""

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def _reader_gone(self) -> None:
        self.closed_pipe = True
        _STDOUT_GONE.set()
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no file descriptor (a captured stream)
            pass
        for stop in _INSTALLED:
            stop._note(signal.SIGPIPE, None)

"""Stop signals, owned by the core for one run: noted when they arrive, acted on at the next
iteration boundary (training or validation), agreed across ranks, then re-delivered so that
the process ends the way the signal would have ended it (128 + N).

A signal handler only notes the signal: stopping at a boundary is what makes the save taken
then consistent (the position it records is the one its weights belong to). A second SIGINT
is Ctrl-C pressed again: it raises ``KeyboardInterrupt`` at once.

Under torch.distributed every rank must stop at the same iteration, but the signal reaches
each rank at its own moment (or only one of them). The ranks agree at the training loop's
report points (every ``log_interval`` iterations and at epoch ends), in the one small
all-reduce the core makes there (:meth:`hookrun.reporting.Reporter.agree_ranks`), none in the
iterations between.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

UNCATCHABLE = {"SIGKILL", "SIGSTOP"}
DEFAULT_STOP_SIGNALS = ("SIGTERM", "SIGINT")


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

    def install(self, world_size: int) -> bool:
        """Note the signals from now on; False when not in the main thread (nothing done)."""
        self.caught = self.agreed = None
        if not self.numbers:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        self.distributed = world_size > 1
        for number in self.numbers:
            self.previous[number] = signal.signal(number, self._note)
        return True

    def _note(self, signum: int, _frame: Any) -> None:
        if self.caught == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without waiting for a boundary
        if self.caught is None:
            self.caught = signum
            if not self.distributed:
                self.agreed = signum

    def settle(self, signum: int) -> None:
        """Under torch.distributed: the largest signal number any rank caught (0: none), as
        the ranks agreed at a report point; the first agreement stands."""
        if self.agreed is None and signum:
            self.agreed = signum

    def restore(self) -> dict[int, Any]:
        """Put the previous handlers back; returns them by signal number."""
        previous = {n: signal.SIG_DFL if h is None else h for n, h in self.previous.items()}
        for number, handler in previous.items():
            signal.signal(number, handler)
        self.previous = {}
        return previous

    def redeliver(self) -> None:
        """End the way the signal would have ended the process: its previous handler runs
        (Python's SIGINT handler raises ``KeyboardInterrupt``), or the default action ends the
        process with status 128 + N. A signal caught too late to stop training (under
        torch.distributed, after the last agreement) is re-delivered too."""
        number = self.agreed or self.caught
        self.agreed = self.caught = None
        if number is not None:
            sys.stdout.flush()  # a default action ends the process without Python's cleanup
            sys.stderr.flush()
            signal.raise_signal(number)

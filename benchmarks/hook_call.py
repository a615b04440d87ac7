"""Per-call cost of one hook point: hookrun's dispatcher against pluggy's own hook call.

Like pluggy's ``testing/benchmark.py``: 0, 1, 5 and 10 plain implementations of
``after_train_iter`` (one-line methods taking ``runner`` and ``batch_idx``), alone and inside
one ``wrapper=True`` wrapper, registered in one hookrun ``PluginManager``. Each is called with
the runner's four keyword arguments through ``manager.hooks.after_train_iter(...)`` (hookrun)
and ``manager.pm.hook.after_train_iter(...)`` (pluggy's ``_multicall`` over the same
implementations). Runs alternate between the two; the best of ``--repeats`` runs of
``--number`` calls is printed in ns of CPU time (``time.thread_time``) per call.

    python benchmarks/hook_call.py [--number 100000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import time
import timeit
from collections.abc import Generator
from typing import Any

os.environ["HOOKRUN_PLUGINS_AUTOLOAD"] = "0"  # only the implementations below

from hookrun import hookimpl  # noqa: E402
from hookrun.hooks.manager import PluginManager  # noqa: E402

CALL = "call(runner=None, batch_idx=0, batch=None, outputs=None)"


class Plain:
    """A plain implementation doing as little as a hook can."""

    def __init__(self, n: int) -> None:
        self.name = f"plain{n}"

    @hookimpl
    def after_train_iter(self, runner: Any, batch_idx: int) -> None:
        pass


class Wrapper:
    """A new-style wrapper that passes the result through."""

    name = "wrapper"

    @hookimpl(wrapper=True)
    def after_train_iter(self, runner: Any) -> Generator[None, Any, Any]:
        return (yield)


def ns_per_call(call: Any, number: int) -> float:
    """One run of ``number`` calls, in ns of this thread's CPU time per call (other processes
    on a shared machine barely move it)."""
    timer = timeit.Timer(CALL, timer=time.thread_time, globals={"call": call})
    return timer.timeit(number) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print("| implementations | hookrun ns/call | pluggy ns/call | hookrun / pluggy |")
    print("|---|---:|---:|---:|")
    for wrapped in (False, True):
        for n in (0, 1, 5, 10):
            hooks: list[object] = [Plain(i) for i in range(n)]
            if wrapped:
                hooks.append(Wrapper())
            manager = PluginManager({}, hooks)
            ours = theirs = float("inf")
            for _ in range(args.repeats):  # alternate, so drifting machine load hits both
                ours = min(ours, ns_per_call(manager.hooks.after_train_iter, args.number))
                theirs = min(theirs, ns_per_call(manager.pm.hook.after_train_iter, args.number))
            label = f"{n} plain" + (" + 1 wrapper" if wrapped else "")
            print(f"| {label} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()

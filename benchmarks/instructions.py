"""Instructions per training iteration, counted by valgrind's callgrind: the overhead
benchmark's loop (MLP 64-128-10, batch 32, one thread) by hand and under hookrun, with no
plugin and with the default plugins and writers.

Wall-clock ratios on a shared machine move by a percent from run to run; an instruction
count does not (hash seed fixed), so it shows what a change to the loop costs or saves.
Each case runs twice, two epochs of 100 and of 300 iterations, with counting on from each
epoch's first iteration to its end (a client request through a small C shim, built here);
the difference between the two runs is 400 iterations' worth, start-up and teardown
cancelled. Cache misses are not counted: a report's cold code costs more time than its
instructions say.

    python benchmarks/instructions.py [--heap]

``--heap`` counts the hand loop instead with each loss detached and dropped, and with the
last 50 or 150 detached losses kept (as the Runner's scalar store keeps them until and after
a report): what one-number tensors kept alive cost the allocator (docs/benchmarks.md).

Needs valgrind with its headers and a C compiler; says so and exits 0 without them.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SHIM = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; }
void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""
SHORT, LONG, EPOCHS = 100, 300, 2
CASES = ("hand-written loop", "hookrun, no plugins", "hookrun, default plugins")
HEAP_CASES = {  # --heap: hand loops keeping this many detached losses (0: each dropped)
    "hand loop, each loss detached": 0,
    "hand loop, 50 detached losses kept": 50,
    "hand loop, 150 detached losses kept": 150,
}


def probe(case: str, iters: int, shim: str) -> None:
    """Train ``EPOCHS`` epochs of ``iters`` iterations with ``overhead.py``'s loops,
    counting inside each epoch."""
    import torch
    from overhead import hand_loop, runner_loop

    torch.set_num_threads(1)
    counter = ctypes.CDLL(shim)
    marks = (counter.start, counter.stop)
    if case == CASES[0]:
        hand_loop(iters, epochs=EPOCHS, marks=marks)
    elif case in HEAP_CASES:
        kept_losses_loop(iters, HEAP_CASES[case], marks)
    else:
        runner_loop(iters, case == CASES[2], epochs=EPOCHS, marks=marks)


def kept_losses_loop(iters: int, keep: int, marks: tuple) -> None:
    """The hand loop detaching every loss and keeping the last ``keep`` of them, the 50 of an
    interval averaged at each report (``keep=0``: each detached loss dropped at once)."""
    from collections import deque

    import torch
    from overhead import make_data, make_model
    from torch import nn

    model, loader = make_model(), make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    kept: deque = deque(maxlen=max(keep, 1))
    for _ in range(EPOCHS):
        marks[0]()
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            kept.append(loss.detach())
            if not keep:
                kept.clear()
            if (i + 1) % 50 == 0:  # the report: the interval's mean, or the loss as by hand
                if keep:
                    torch.stack(list(kept)[-50:]).mean().item()
                else:
                    loss.item()
        marks[1]()


def counted(case: str, iters: int, shim: str, out: Path) -> int:
    """The instructions callgrind counted in one probe run."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "HOOKRUN_DISABLE_PLUGINS": "ema,precise_bn"}
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--probe",
        case,
        str(iters),
        shim,
    ]
    subprocess.run(command, env=env, check=True, capture_output=True)
    totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")]
    return int(totals[0].split()[1])


def main() -> None:
    header = Path("/usr/include/valgrind/callgrind.h")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not (shutil.which("valgrind") and header.exists() and compiler):
        print("instructions.py: needs valgrind, its headers and a C compiler; skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        source, shim = Path(tmp) / "shim.c", Path(tmp) / "shim.so"
        source.write_text(SHIM)
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", shim, source], check=True)
        cases = (CASES[0], *HEAP_CASES) if "--heap" in sys.argv else CASES
        per_iter = {}
        for case in cases:
            short, long = (
                counted(case, n, str(shim), Path(tmp) / f"out.{n}") for n in (SHORT, LONG)
            )
            per_iter[case] = (long - short) / (EPOCHS * (LONG - SHORT))
    hand = per_iter[CASES[0]]
    print("instructions per iteration (callgrind), MLP 64-128-10, batch 32, one thread")
    print(f"{'case':36s} {'instructions':>13s} {'over the hand loop':>20s}")
    for case, count in per_iter.items():
        extra = count - hand
        print(f"{case:36s} {count:13,.0f} {extra:+13,.0f} ({extra / hand:+.2%})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        sys.path.insert(0, str(Path(__file__).parent))
        probe(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()

"""What one training report costs, and its parts, in place: the overhead benchmark's run
(small MLP, CPU, one thread, default plugins, both writers, ``log_interval=50``) with each
part of ``Reporter.report`` timed where it runs, after 50 iterations of training have
pushed its code and data out of the caches (a loop of reports alone would flatter them).

    python benchmarks/report_cost.py [--iters 4000] [--repeats 3]

Prints the median over the run's reports of each part, and the report's share of an
iteration at the run's pace.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead import make_data, make_model  # noqa: E402

from hookrun import Runner  # noqa: E402
from hookrun.writers import JsonlWriter, TensorBoardWriter  # noqa: E402

Times = defaultdict[str, list[float]]


def timed(times: Times, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter() - start)

    return wrapper


def one_run(iters: int, times: Times) -> float:
    """Seconds per iteration of a run whose report parts are timed into ``times``."""
    model = make_model()
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=torch.nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            writers=("jsonl", "tensorboard"),
            log_interval=50,
        )
        reporter, scalars, hooks = runner.reporter, runner.scalars, runner.hooks
        reporter.report = timed(times, "report (all of it)", reporter.report)
        scalars.report = timed(times, "  scalar store read", scalars.report)
        hooks.after_report = timed(times, "  after_report (logger line)", hooks.after_report)
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            runner.train()
        return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    times: Times = defaultdict(list)
    JsonlWriter.write_scalars = timed(times, "  JSONL line", JsonlWriter.write_scalars)  # type: ignore[method-assign]
    TensorBoardWriter.write_scalars = timed(  # type: ignore[method-assign]
        times, "  TensorBoard event", TensorBoardWriter.write_scalars
    )
    one_run(args.iters // 4, defaultdict(list))  # warm-up
    times.clear()
    per_iter = statistics.median(one_run(args.iters, times) for _ in range(args.repeats))
    print(f"torch {torch.__version__}, {args.iters} iterations x {args.repeats} runs, 1 thread")
    print(f"{'part':34s} {'median us':>10s} {'reports':>8s}")
    for name, values in times.items():
        print(f"{name:34s} {statistics.median(values) * 1e6:10.1f} {len(values):8d}")
    report = statistics.median(times["report (all of it)"])
    print(
        f"iteration {per_iter * 1e6:.1f} us; a report every 50 iterations adds "
        f"{report / 50 * 1e6:.1f} us per iteration ({report / 50 / per_iter:.2%})"
    )


if __name__ == "__main__":
    main()

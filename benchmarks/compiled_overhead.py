"""Per-iteration overhead with a compiled model: the overhead benchmark's MLP, as a module
with its own ``forward``, compiled in place with ``model.compile()`` (inductor, CPU), trained
by hookrun and by the same hand loop. (``nn.Sequential.compile()`` compiles nothing: dynamo
skips the ``_call_impl`` of torch's own modules, see docs/compiled-models.md.)

One model is compiled once and shared by every run (its weights reset before each), so the
compiled code is built once, outside the timed runs, and every run times the same kernels.
Rounds run every case in a rotating order; ratios are medians of the ratio within a round
(as ``overhead.py``). Budget (issue 36): the same as the eager loop, no plugins <= 1.015x and
default plugins <= 1.03x.

    python benchmarks/compiled_overhead.py [--iters 2000] [--repeats 11]
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from overhead import CLASSES, FEATURES, HIDDEN, hand_loop, measure, report, runner_loop
from torch import nn


class Mlp(nn.Module):
    """``overhead.make_model``'s layers, seeded alike, under a forward of its own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=11)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    model = Mlp()
    initial = copy.deepcopy(model.state_dict())
    model.compile()
    start = time.perf_counter()
    hand_loop(50, model)  # compiles forward and backward, outside the timed runs
    compiling = time.perf_counter() - start

    def fresh(run):
        def case() -> float:
            model.load_state_dict(initial)  # in place: the compiled code's guards still hold
            return run()

        return case

    cases = {
        "hand-written loop": fresh(lambda: hand_loop(args.iters, model)),
        "hookrun, no plugins": fresh(lambda: runner_loop(args.iters, False, model=model)),
        "hookrun, default plugins": fresh(lambda: runner_loop(args.iters, True, model=model)),
    }
    report(
        f"torch {torch.__version__}, compiled MLP (inductor, CPU; first compilation "
        f"{compiling:.0f} s), {args.iters} iterations x {args.repeats} rounds, 1 thread",
        measure(cases, args.repeats),
    )


if __name__ == "__main__":
    main()

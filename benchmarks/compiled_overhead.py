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
import tempfile
import time

import torch
from overhead import CLASSES, FEATURES, HIDDEN, Timing, make_data, measure, report
from torch import nn

from hookrun import Runner


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


def hand_loop(model: nn.Module, iters: int) -> float:
    """The overhead benchmark's hand loop on the compiled model."""
    loader = make_data(iters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    logged = []
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (i + 1) % 50 == 0:
            logged.append(loss.item())
    return (time.perf_counter() - start) / iters


def runner_loop(model: nn.Module, iters: int, default_plugins: bool) -> float:
    """The Runner on the compiled model: no plugin, or the default plugins and writers."""
    from hookrun.hooks.discovery import installed_plugins

    timing = Timing()
    plugins = None if default_plugins else dict.fromkeys(installed_plugins(), False)
    with tempfile.TemporaryDirectory() as work_dir:
        Runner(
            model,
            make_data(iters),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            criterion=nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            plugins=plugins,
            hooks=[timing],
            writers=("jsonl", "tensorboard") if default_plugins else (),
            log_interval=50,
        ).train()
    return timing.elapsed / iters


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
    hand_loop(model, 50)  # compiles forward and backward, outside the timed runs
    compiling = time.perf_counter() - start

    def fresh(run):
        def case() -> float:
            model.load_state_dict(initial)  # in place: the compiled code's guards still hold
            return run()

        return case

    cases = {
        "hand-written loop": fresh(lambda: hand_loop(model, args.iters)),
        "hookrun, no plugins": fresh(lambda: runner_loop(model, args.iters, False)),
        "hookrun, default plugins": fresh(lambda: runner_loop(model, args.iters, True)),
    }
    report(
        f"torch {torch.__version__}, compiled MLP (inductor, CPU; first compilation "
        f"{compiling:.0f} s), {args.iters} iterations x {args.repeats} rounds, 1 thread",
        measure(cases, args.repeats),
    )


if __name__ == "__main__":
    main()

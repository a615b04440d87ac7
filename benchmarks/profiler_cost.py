"""Per-iteration cost of the profiler plugin outside and inside its windows (tiny MLP, CPU).

``profiler`` with a window that never opens (``skip_first`` beyond the run) is what every
iteration outside a window costs: DESIGN §9 asks zero. The run profiling its middle 20
iterations shows, for scale, what a window costs (its traces are written then).

    python benchmarks/profiler_cost.py [--iters 2000] [--repeats 5]
"""

from __future__ import annotations

from nan_guard_cost import plugin_cost

if __name__ == "__main__":
    plugin_cost(
        {
            "no plugins": {},
            "profiler, outside any window": {"profiler": {"skip_first": 10**9}},
            "profiler, one window of 20 iterations": {
                "profiler": {"skip_first": 900, "wait": 0, "warmup": 2, "active": 20}
            },
        }
    )

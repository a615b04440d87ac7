"""Per-iteration cost of the memory plugin (tiny MLP, CPU, a report every 50 iterations).

``memory: {}`` adds no per-iteration hook: its gauges are read when the core reports. The
cost left is two reads of ``/proc/self/status`` per report.

    python benchmarks/memory_cost.py [--iters 2000] [--repeats 5]
"""

from __future__ import annotations

from nan_guard_cost import plugin_cost

if __name__ == "__main__":
    plugin_cost({"no plugins": {}, "memory: {}": {"memory": {}}})

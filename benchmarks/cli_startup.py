"""Start-up cost of ``hookrun plugins list`` against ``python -c "import importlib.metadata"``.

Budget (DESIGN §10): with the five built-in plugins installed, the median wall time of
``hookrun plugins list`` is at most 2x that of importing importlib.metadata, and the
command imports no torch. Both commands run alternately in fresh interpreters; medians of
wall time and of the child's CPU time (user + system, which other processes on a shared
machine barely move) are printed.

    python benchmarks/cli_startup.py [--repeats 21]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def hookrun_script() -> str:
    beside = Path(sys.executable).parent / "hookrun"
    return str(beside) if beside.exists() else shutil.which("hookrun") or "hookrun"


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def imported_modules(cmd: list[str]) -> set[str]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stderr
    return {
        line.split("|")[-1].strip().split(".")[0]
        for line in out.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    commands = {
        "python -c 'import importlib.metadata'": [
            sys.executable,
            "-c",
            "import importlib.metadata",
        ],
        "hookrun plugins list": [hookrun_script(), "plugins", "list"],
        "python -m hookrun plugins list": [sys.executable, "-m", "hookrun", "plugins", "list"],
    }
    listed = subprocess.run(
        [hookrun_script(), "plugins", "list"], capture_output=True, text=True, check=True
    ).stdout
    plugins = [line.split()[0] for line in listed.splitlines()[2:] if line.strip()]
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; plugins installed: {', '.join(plugins)}"
    )

    for cmd in commands.values():  # warm the file system cache
        timed(cmd)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, cmd in commands.items():
            samples[name].append(timed(cmd))

    base_wall = statistics.median(w for w, _ in samples["python -c 'import importlib.metadata'"])
    base_cpu = statistics.median(c for _, c in samples["python -c 'import importlib.metadata'"])
    print(f"\n{'command':34} {'wall ms':>8} {'cpu ms':>8} {'wall x':>7} {'cpu x':>7}")
    for name, values in samples.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(
            f"{name:34} {wall * 1e3:8.1f} {cpu * 1e3:8.1f} "
            f"{wall / base_wall:7.2f} {cpu / base_cpu:7.2f}"
        )

    heavy = {"torch", "pydantic", "pluggy", "numpy", *(f"hookrun_{p}" for p in plugins)}
    found = imported_modules(commands["hookrun plugins list"]) & heavy
    ratio = statistics.median(w for w, _ in samples["hookrun plugins list"]) / base_wall
    print(f"\nheavy modules imported by `hookrun plugins list`: {sorted(found) or 'none'}")
    verdict = "within" if ratio <= 2 and not found else "OVER"
    print(f"budget <= 2.00x wall: {ratio:.2f}x -> {verdict} budget")


if __name__ == "__main__":
    main()

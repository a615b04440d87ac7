"""Start-up of ``hookrun train``: from the command to the first iteration of the digits job,
against ``python -c "import torch, sklearn"`` (what the job cannot start without).

The digits job (examples/digits) runs with its own plugins; a hook added by a wrapper task
notes the time as the first iteration begins and ends the process there. Both commands run
alternately in fresh interpreters; medians are printed. Then ``python -X importtime`` of the
same start-up lists the modules that took longest (cumulative, top-level imports), so an
import the run does not need shows up by name.

    python benchmarks/train_startup.py [--repeats 7] [--top 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIGITS = Path(__file__).parents[1] / "examples" / "digits"

WRAPPER = """
import os
import time

from hookrun import hookimpl
from task import build as digits


class FirstIteration:
    @hookimpl
    def before_train_iter(self):
        with open(os.environ["STARTUP_STAMP"], "w") as stamp:
            stamp.write(repr(time.time()))
        os._exit(0)


def build(**kwargs):
    objects = digits(**kwargs)
    objects["hooks"] = [FirstIteration()]
    return objects
"""


def to_first_iteration(folder: Path, extra: list[str] | None = None) -> tuple[float, str]:
    """Seconds from starting ``hookrun train`` to its first iteration; its stderr."""
    stamp = folder / "stamp"
    stamp.unlink(missing_ok=True)
    command = [sys.executable, *(extra or []), "-m", "hookrun", "train", str(folder / "run.yaml")]
    work_dir = tempfile.mkdtemp(dir=folder)  # a fresh one: the run ends before its first save
    command += ["--work-dir", work_dir]
    env = {**os.environ, "STARTUP_STAMP": str(stamp), "PYTHONPATH": str(DIGITS)}
    start = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if not stamp.exists():
        raise SystemExit(f"the digits job did not reach its first iteration:\n{done.stderr}")
    return float(stamp.read_text()) - start, done.stderr


BASELINES = {
    "python -c 'import torch, sklearn'": "import torch, sklearn",
    # torch.optim's first optimizer imports torch._dynamo (about a second): a hand loop pays it too
    "... and build one torch optimizer": "import torch, sklearn; torch.optim.SGD([torch.zeros(1)])",
}


def baseline(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def slowest_imports(importtime: str, top: int) -> list[tuple[float, str]]:
    """The ``top`` top-level imports by cumulative time (ms)."""
    found = []
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if not name.startswith(" ") or name.startswith("  "):  # top-level: one leading space
            continue
        if cumulative.strip().isdigit():
            found.append((int(cumulative) / 1e3, name.strip()))
    return sorted(found, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "startup_task.py").write_text(WRAPPER)
        config = (
            (DIGITS / "config.yaml").read_text().replace("task.py:build", "startup_task.py:build")
        )
        (folder / "run.yaml").write_text(config)
        to_first_iteration(folder)  # warm the file system cache
        train: list[float] = []
        bare: dict[str, list[float]] = {name: [] for name in BASELINES}
        for _ in range(args.repeats):
            train.append(to_first_iteration(folder)[0])
            for name, code in BASELINES.items():
                bare[name].append(baseline(code))
        _, importtime = to_first_iteration(folder, ["-X", "importtime"])
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}, medians of {args.repeats}"
    )
    first = statistics.median(train)
    print(f"{'hookrun train examples/digits to its first iteration':54} {first * 1e3:6.0f} ms")
    for name, times in bare.items():
        seconds = statistics.median(times)
        print(f"{name:54} {seconds * 1e3:6.0f} ms  (hookrun: {first / seconds:.2f} x)")
    print("\nslowest top-level imports of that start-up (cumulative ms, -X importtime):")
    for ms, name in slowest_imports(importtime, args.top):
        print(f"  {ms:8.1f}  {name}")


if __name__ == "__main__":
    main()

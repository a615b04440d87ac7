"""Run by hand (not collected by pytest): ``torchrun --max-restarts=1 ... --resume auto`` with
rank 1 SIGKILLed at iteration 7 of the first attempt, repeated; prints how many tries finish
bit-identical to an uninterrupted run. The suite runs one try
(``test_a_killed_job_resumes_and_a_torchrun_restart_after_a_killed_rank_too``).

Usage: python tests/jobs/dist_restarts.py [TRIES]   (default 5; about 40 s a try on 2 cores)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hookrun.testing import assert_same_checkpoint, isolated_env

JOB = Path(__file__).with_name("dist_job.py")


def torchrun(work_dir: Path, *args: str, restarts: int = 0) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", f"--max-restarts={restarts}", str(JOB), str(work_dir)]
    env = isolated_env({**os.environ, "OMP_NUM_THREADS": "1"})
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=300)


def main() -> None:
    tries = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "reference"
        proc = torchrun(reference)
        if proc.returncode != 0:
            sys.exit(f"the uninterrupted run failed:\n{proc.stderr[-3000:]}")
        good = 0
        for n in range(1, tries + 1):
            work = Path(tmp) / f"try{n}"
            try:
                proc = torchrun(work, "--resume", "--first-attempt-kill-at", "7", restarts=1)
                assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-500:]}"
                assert "resumed from" in proc.stdout, "the second attempt did not resume"
                assert_same_checkpoint(reference / "final.pt", work / "final.pt")
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                print(f"try {n}: FAILED {exc}", flush=True)
                continue
            good += 1
            print(f"try {n}: restarted, resumed, bit-identical", flush=True)
        print(f"{good} of {tries} restarts finished bit-identical to the uninterrupted run")


if __name__ == "__main__":
    main()

"""Each of 2 ranks trains a different scripted loss with ``early_stopping`` watching
``train/loss``; rank 0's would stop, rank 1's never would. Each rank writes the iterations
it trained to ``rank<R>.json``. Usage: python train_monitor_job.py WORK_DIR (each rank, see
``hookrun.testing.run_ranks``; the plugin's tests folder on the path)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from early_stopping_testing import scripted_loss_runner

PLATEAU = [3.0, 2.0, 2.5, 2.4, 2.6, 2.2, 2.1, 2.3, 2.5, 2.0, 1.0, 0.5]
FALLING = [3.0 - 0.2 * i for i in range(len(PLATEAU))]


def main(work_dir: Path) -> None:
    rank = int(os.environ["RANK"])
    runner = scripted_loss_runner(
        work_dir / "run", PLATEAU if rank == 0 else FALLING, {"patience": 2}, log_interval=2
    )
    runner.train()
    (work_dir / f"rank{rank}.json").write_text(json.dumps({"iter": runner.iter}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

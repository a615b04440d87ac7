"""A training job for the kill and signal tests: ``hookrun.testing``'s resume task (random
augmentation, dropout, AdamW, a scheduler) with the checkpoint plugin and a second stateful
hook (``Counter``).

Usage: python checkpoint_job.py WORK_DIR OPTIONS_JSON
OPTIONS: resume (bool), kill_at (SIGKILL before that iteration), kill_in_save_at (SIGKILL
while collecting the checkpoint of that many iterations), sleep (seconds per iteration),
checkpoint (settings overrides). Prints "iter N" after each iteration; writes
WORK_DIR/final.pt when training ends.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

from hookrun import Runner, hookimpl
from hookrun.testing import KillAt, resume_task_kwargs

CHECKPOINT = {"by_epoch": False, "interval": 3, "max_keep": 2, "save_best": "accuracy"}


class Counter:
    """A stateful ad-hoc hook: counts iterations and sums the losses (a tensor)."""

    name = "counter"

    def __init__(self, options: dict) -> None:
        self.options = options
        self.iters = 0
        self.loss_sum = torch.zeros((), dtype=torch.float64)

    @hookimpl
    def after_train_iter(self, runner, outputs):
        self.iters += 1
        self.loss_sum += outputs["loss"].double()
        time.sleep(self.options.get("sleep", 0))
        print(f"iter {runner.iter + 1}", flush=True)

    @hookimpl
    def before_save_checkpoint(self, runner, checkpoint):
        if checkpoint["meta"]["iter"] == self.options.get("kill_in_save_at"):
            os.kill(os.getpid(), signal.SIGKILL)

    def state_dict(self) -> dict:
        return {"iters": self.iters, "loss_sum": self.loss_sum.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.iters = state["iters"]
        self.loss_sum = state["loss_sum"].clone()


def main(work_dir: str, options: dict) -> None:
    torch.set_num_threads(1)
    runner = Runner(
        **resume_task_kwargs(
            work_dir,
            plugins={"checkpoint": {**CHECKPOINT, **options.get("checkpoint", {})}},
            hooks=[Counter(options), KillAt(options.get("kill_at"))],
        )
    )
    runner.train(resume="auto" if options.get("resume") else None)
    runner.save_checkpoint(os.path.join(work_dir, "final.pt"))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))

"""The task of tests/test_checkpoint_storage.py's ``hookrun train`` runs: the resume task of
``hookrun.testing`` (augmentation drawing from every generator, dropout, AdamW, a StepLR
schedule; 7 batches an epoch), SIGKILLed as iteration ``$STORAGE_KILL_AT`` starts when that
is set (after the checkpoints of the iterations before it are written)."""

from __future__ import annotations

import os
from typing import Any

from hookrun.testing import KillAt, resume_task_kwargs

OBJECTS = ("model", "train_dataloader", "val_dataloader", "optimizer", "scheduler", "criterion")


def build() -> dict[str, Any]:
    kwargs = resume_task_kwargs("unused")
    objects = {key: kwargs[key] for key in OBJECTS}
    objects["metrics"] = kwargs["metrics"]
    kill = os.environ.get("STORAGE_KILL_AT")
    objects["hooks"] = [KillAt(int(kill))] if kill else []
    return objects

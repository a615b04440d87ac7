"""Per-iteration overhead against the runners users would pick instead (small MLP, CPU).

Every contender trains the same model on the same batches for one epoch, logs the loss
every 50 iterations to TensorBoard, and does not checkpoint inside the timed region (the
epoch, from its start event to its end event). Runs alternate between contenders and the
medians are reported with their ratio to the hand-written loop. Contenders that are not
installed are listed as skipped; `nox -s bench` installs MMEngine, Lightning and Ignite.

    python benchmarks/peers.py [--iters 2000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import torch
from overhead import BATCH, hand_loop, make_data, make_model, measure, report, runner_loop
from torch import nn


def mmengine_loop(iters: int) -> float:
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.runner import Runner as MMRunner

    class Net(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def forward(self, inputs, targets, mode="loss"):
            return {"loss": nn.functional.cross_entropy(self.net(inputs), targets)}

    class EpochTimer(Hook):
        def before_train_epoch(self, runner) -> None:
            self.start = time.perf_counter()

        def after_train_epoch(self, runner) -> None:
            self.elapsed = time.perf_counter() - self.start

    timer = EpochTimer()
    with tempfile.TemporaryDirectory() as work_dir:
        runner = MMRunner(
            model=Net(), work_dir=work_dir, train_dataloader=make_data(iters),
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
            train_cfg=dict(by_epoch=True, max_epochs=1),
            default_hooks=dict(logger=dict(type="LoggerHook", interval=50), checkpoint=None),
            visualizer=dict(type="Visualizer",
                            vis_backends=[dict(type="TensorboardVisBackend")]),
            custom_hooks=[timer], log_level="WARNING",
        )  # fmt: skip
        runner.train()
    return timer.elapsed / iters


def lightning_loop(iters: int) -> float:
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class EpochTimer(L.Callback):
        def on_train_epoch_start(self, trainer, module) -> None:
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, module) -> None:
            self.elapsed = time.perf_counter() - self.start

    timer = EpochTimer()
    with tempfile.TemporaryDirectory() as work_dir:
        trainer = L.Trainer(
            max_epochs=1, accelerator="cpu", devices=1, log_every_n_steps=50,
            logger=TensorBoardLogger(work_dir), enable_checkpointing=False,
            enable_model_summary=False, callbacks=[timer], default_root_dir=work_dir,
        )  # fmt: skip
        trainer.fit(Net(), make_data(iters))
    return timer.elapsed / iters


def ignite_loop(iters: int) -> float:
    from ignite.engine import Events, create_supervised_trainer
    from tensorboardX import SummaryWriter

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = create_supervised_trainer(model, optimizer, nn.CrossEntropyLoss())
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as work_dir:
        writer = SummaryWriter(work_dir)

        @trainer.on(Events.ITERATION_COMPLETED(every=50))
        def log(engine) -> None:
            writer.add_scalar("loss", engine.state.output, engine.state.iteration)

        trainer.add_event_handler(
            Events.EPOCH_STARTED, lambda _: times.update(start=time.perf_counter())
        )
        trainer.add_event_handler(
            Events.EPOCH_COMPLETED, lambda _: times.update(end=time.perf_counter())
        )
        trainer.run(make_data(iters), max_epochs=1)
        writer.close()
    return (times["end"] - times["start"]) / iters


def contenders(iters: int) -> dict[str, Callable[[], float]]:
    found: dict[str, Callable[[], float]] = {
        "hand-written loop": lambda: hand_loop(iters),
        "hookrun, no plugins": lambda: runner_loop(iters, False),
        "hookrun, default plugins": lambda: runner_loop(iters, True),
    }
    for name, module, fn in [
        ("MMEngine Runner", "mmengine", mmengine_loop),
        ("Lightning Trainer", "lightning", lightning_loop),
        ("Ignite Engine", "ignite", ignite_loop),
    ]:
        try:
            __import__(module)
        except Exception as exc:  # not installed, or broken beside this torch
            print(f"skipped {name}: {type(exc).__name__}: {exc}")
            continue
        found[name] = lambda fn=fn: fn(iters)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args, _ = parser.parse_known_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    report(
        f"torch {torch.__version__}; {args.iters} iterations x {args.repeats} rounds; "
        f"1 thread; MLP, batch {BATCH}; log every 50 iterations; no checkpoint in the timing",
        measure(contenders(args.iters), args.repeats),
    )


if __name__ == "__main__":
    main()

"""Checkpoint cost: synchronous save vs the training-thread stall of ``async_save``.

State: ResNet-50-shaped parameters (conv / batch-norm / fc shapes, 25.6 M parameters, plain
``nn.Conv2d`` / ``nn.BatchNorm2d`` / ``nn.Linear`` layers, no torchvision) with AdamW state.
Each run trains ``ITERS`` iterations (a cheap loss over every parameter, AdamW steps) with the
checkpoint plugin saving every ``INTERVAL`` iterations, and times each save call (what the
training thread spends in it):

- sync: ``async_save: false``, the whole save (collect, torch.save, fsync, rename, pointer);
- async: ``async_save: true``, what training waits for (collect + host copy, plus any wait
  for the previous write); the first save also allocates the host buffers, later saves
  reuse them, so the steady-state stall is the median of the later saves;
- plain ``torch.save`` of the same state into a file, no fsync, for comparison.

Budget (DESIGN §10): async stall <= 30 % of the synchronous save.

    python benchmarks/checkpoint.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HOOKRUN_PLUGINS_AUTOLOAD", "0")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hookrun import Runner  # noqa: E402

ITERS, INTERVAL = 24, 6  # saves at iterations 6, 12, 18, 24


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, planes: int, downsample: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        if downsample:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
            )


class ResNet50Shapes(nn.Module):
    """The parameters and buffers of torchvision's resnet50, without its forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        inplanes, layers = 64, []
        for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
            stage = [Bottleneck(inplanes, planes, True)]
            stage += [Bottleneck(planes * 4, planes, False) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*stage))
            inplanes = planes * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, 1000)

    def training_step(self, batch: torch.Tensor) -> torch.Tensor:
        """A cheap loss touching every parameter, so AdamW has a state for each."""
        return sum(p.float().pow(2).sum() for p in self.parameters()) * 1e-8  # type: ignore[return-value]


def train(work_dir: Path, checkpoint: dict | bool) -> tuple[Runner, float, list[float]]:
    """Train; returns the runner, the wall time and the seconds of each save call."""
    torch.manual_seed(0)
    model = ResNet50Shapes()
    runner = Runner(
        model,
        train_dataloader=[torch.zeros(1)] * ITERS,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        max_iters=ITERS,
        work_dir=work_dir,
        plugins={"checkpoint": checkpoint},
        writers=(),
        device="cpu",
    )
    saves: list[float] = []
    plugin = runner.plugins.get("checkpoint")
    if plugin is not None:
        save = plugin._save  # type: ignore[attr-defined]

        def timed(*args: object, **kwargs: object) -> None:
            start = time.perf_counter()
            save(*args, **kwargs)
            saves.append(time.perf_counter() - start)

        plugin._save = timed  # type: ignore[attr-defined]
    runner.manager.stats.profile = True
    start = time.perf_counter()
    runner.train()
    return runner, time.perf_counter() - start, saves


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def state_mb(runner: Runner) -> float:
    state = runner.checkpoint_state()
    total = 0
    for group in (state["model"], *state["optimizer"]["state"].values()):
        total += sum(t.numel() * t.element_size() for t in group.values() if t.dim())
    return total / 1e6


def main() -> None:
    torch.set_num_threads(1)
    settings = {"by_epoch": False, "interval": INTERVAL, "max_keep": 1}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        root = Path(tmp)
        _, bare, _ = train(root / "none", False)
        _, sync_wall, sync_saves = train(root / "sync", settings)
        async_runner, async_wall, stalls = train(root / "async", {**settings, "async_save": True})
        final_wait = async_runner.manager.stats.per_hook[("checkpoint", "after_run")][1]
        sync_save = median(sync_saves)
        stall = median(stalls[1:])

        state = async_runner.checkpoint_state()
        plain = []
        for i in range(3):
            start = time.perf_counter()
            torch.save(state, root / f"plain_{i}.pt")
            plain.append(time.perf_counter() - start)
        plain_save = median(plain)
        size = state_mb(async_runner)

    print(f"state: ResNet-50 shapes + AdamW, {size:.0f} MB of tensors; {ITERS} iterations,")
    print(f"a checkpoint every {INTERVAL} (max_keep 1); torch {torch.__version__}, 1 thread")
    print(f"{'':44}{'ms':>9}")
    print(f"{'plain torch.save (no fsync), median of 3':44}{plain_save * 1e3:9.1f}")
    print(f"{'sync save (plugin, atomic + fsync), median':44}{sync_save * 1e3:9.1f}")
    print(f"{'async_save stall, first save (allocates)':44}{stalls[0] * 1e3:9.1f}")
    print(f"{'async_save stall, later saves, median':44}{stall * 1e3:9.1f}")
    print(f"{'async_save wait at the end of the run':44}{final_wait * 1e3:9.1f}")
    print(
        "each save, ms: sync "
        + " ".join(f"{t * 1e3:.0f}" for t in sync_saves)
        + " | async "
        + " ".join(f"{t * 1e3:.0f}" for t in stalls)
    )
    print(
        f"run wall time: no checkpoints {bare:.2f} s, sync {sync_wall:.2f} s, "
        f"async {async_wall:.2f} s"
    )
    print(f"stall ratio (async stall / sync save): {stall / sync_save:.1%} (budget <= 30%)")


if __name__ == "__main__":
    main()

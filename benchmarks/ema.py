"""EMA update cost on a ResNet-50-sized model, CPU or CUDA (budget: <= 1.25x one flat-tensor lerp_).

The model has ResNet-50's real tensors, built from the shapes below without torchvision: 53
convolutions (each followed by a BatchNorm of its output channels: weight, bias, running mean
and variance, batch counter) and the final fully connected layer, 25,557,032 parameters in
161 tensors. Per update, the median over interleaved rounds of:

- floor: one ``lerp_`` over a single flat float32 tensor holding as many values as the
  parameters (the least memory traffic any EMA of these weights can move);
- hookrun-ema: the plugin's ``after_train_iter`` (``torch._foreach_lerp_`` over the
  parameters and ``torch._foreach_copy_`` of the buffers, default settings);
- loop: ``ema.lerp_(p, 1 - d)`` over the parameters in a Python loop;
- MMEngine ``ExponentialMovingAverage.update_parameters`` and timm ``ModelEmaV3.update``,
  when they import (skipped with a note otherwise).

    python benchmarks/ema.py [--rounds 40] [--threads 1] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
from torch import nn

# ResNet-50's convolutions in order, (out, in, kh, kw); "d" marks each stage's downsample.
CONVS: list[tuple[int, int, int, int]] = [
    (64, 3, 7, 7),
    # layer1: 3 bottlenecks, 64 -> 256
    (64, 64, 1, 1), (64, 64, 3, 3), (256, 64, 1, 1), (256, 64, 1, 1),  # + d
    (64, 256, 1, 1), (64, 64, 3, 3), (256, 64, 1, 1),
    (64, 256, 1, 1), (64, 64, 3, 3), (256, 64, 1, 1),
    # layer2: 4 bottlenecks, 256 -> 512
    (128, 256, 1, 1), (128, 128, 3, 3), (512, 128, 1, 1), (512, 256, 1, 1),  # + d
    (128, 512, 1, 1), (128, 128, 3, 3), (512, 128, 1, 1),
    (128, 512, 1, 1), (128, 128, 3, 3), (512, 128, 1, 1),
    (128, 512, 1, 1), (128, 128, 3, 3), (512, 128, 1, 1),
    # layer3: 6 bottlenecks, 512 -> 1024
    (256, 512, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1), (1024, 512, 1, 1),  # + d
    (256, 1024, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1),
    (256, 1024, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1),
    (256, 1024, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1),
    (256, 1024, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1),
    (256, 1024, 1, 1), (256, 256, 3, 3), (1024, 256, 1, 1),
    # layer4: 3 bottlenecks, 1024 -> 2048
    (512, 1024, 1, 1), (512, 512, 3, 3), (2048, 512, 1, 1), (2048, 1024, 1, 1),  # + d
    (512, 2048, 1, 1), (512, 512, 3, 3), (2048, 512, 1, 1),
    (512, 2048, 1, 1), (512, 512, 3, 3), (2048, 512, 1, 1),
]  # fmt: skip
FC = (1000, 2048)


def resnet50_sized() -> nn.Module:
    """Modules with ResNet-50's parameters and buffers (no forward is needed here)."""
    layers: list[nn.Module] = []
    for out, cin, kh, kw in CONVS:
        layers += [nn.Conv2d(cin, out, (kh, kw), bias=False), nn.BatchNorm2d(out)]
    layers.append(nn.Linear(FC[1], FC[0]))
    model = nn.Sequential(*layers)
    count = sum(p.numel() for p in model.parameters())
    assert count == 25_557_032 and len(list(model.parameters())) == 161, count
    return model


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call. CPU: process time, steadier than wall time on a shared machine and
    equal to it with one thread. CUDA: wall time from a synchronised start to a synchronised
    end, so the kernels the call launched are counted."""
    if device.type != "cuda":
        start = time.process_time()
        fn()
        return time.process_time() - start
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def variants(model: nn.Module, decay: float) -> tuple[dict[str, Callable[[], object]], list[str]]:
    """The update of each implementation, on its own copy of the average; notes for skips."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    device = params[0].device
    flat_ema, flat_w = torch.randn(n, device=device), torch.randn(n, device=device)
    loop_ema = [p.detach().clone() for p in params]
    runs: dict[str, Callable[[], object]] = {
        "floor: one flat lerp_": lambda: flat_ema.lerp_(flat_w, 1 - decay),
    }
    from hookrun_ema import EMA, EMASettings

    plugin = EMA(EMASettings(decay=decay))
    plugin.before_train(SimpleNamespace(unwrapped_model=model))
    step = SimpleNamespace(iter=10**6)  # past warm-up: the full decay
    runs["hookrun-ema"] = lambda: plugin.after_train_iter(step)

    def loop() -> None:
        with torch.no_grad():
            for e, p in zip(loop_ema, params, strict=True):
                e.lerp_(p, 1 - decay)

    runs["per-parameter lerp_ loop"] = loop
    notes = []
    try:
        from mmengine.model import ExponentialMovingAverage

        mm = ExponentialMovingAverage(model, momentum=1 - decay)
        mm.update_parameters(model)  # the first call only copies
        runs["MMEngine ExponentialMovingAverage"] = lambda: mm.update_parameters(model)
    except ImportError as exc:
        notes.append(f"MMEngine skipped: {exc}")
    try:
        from timm.utils.model_ema import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=decay, use_warmup=False)
        runs["timm ModelEmaV3"] = lambda: timm_ema.update(model, step=10**6)
    except ImportError as exc:
        notes.append(f"timm skipped: {exc}")
    return runs, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args, _ = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = resnet50_sized().to(device)
    runs, notes = variants(model, decay=0.9998)
    names = list(runs)
    for fn in runs.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.rounds):  # every round runs each once, in a rotating order
        order = names[i % len(names) :] + names[: i % len(names)]
        round_times = {name: timed(runs[name], device) for name in order}
        for name in names:
            times[name].append(round_times[name])
            ratios[name].append(round_times[name] / round_times[names[0]])
    print(
        f"EMA update, ResNet-50-sized model (25,557,032 params in 161 tensors), {device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.rounds} rounds"
    )
    print(f"{'implementation':<36} {'median ms':>9} {'x floor':>8}")
    for name in names:
        median = statistics.median(times[name]) * 1e3
        print(f"{name:<36} {median:9.2f} {statistics.median(ratios[name]):7.2f}x")
    for note in notes:
        print(note)
    print("x floor: median of per-round ratios; budget for hookrun-ema <= 1.25x")


if __name__ == "__main__":
    main()

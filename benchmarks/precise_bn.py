"""Precise-BN pass vs the same number of plain train-mode forward passes (budget <= 1.15x).

Both sides run the same pre-collated batches through the same Conv/BN network under no_grad:
the baseline in train mode with nothing else, the plugin's pass with its forward pre-hooks,
float64 moments, mode switching and buffer restore/write-back. Data loading is left out of
both, so the ratio is the plugin's own overhead. Prints best-of-N times and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from hookrun_precise_bn import bn_layers, model_forward, recompute_bn_stats
from torch import nn


def conv_bn_net(width: int) -> nn.Module:
    """A small ResNet-like stem: conv/BN/ReLU blocks with two downsamplings and a head."""

    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = [*block(3, width, 1), *block(width, width, 1), *block(width, 2 * width, 2)]
    layers += [*block(2 * width, 2 * width, 1), *block(2 * width, 4 * width, 2)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10)]
    return nn.Sequential(*layers)


def timed(fn) -> float:
    """Seconds of one call: CPU time of this process on CPU (steadier than wall time on a
    shared machine, and equal to it with one thread), wall time with a sync on CUDA."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(width: int, size: int, args: argparse.Namespace) -> tuple[float, float, int]:
    """Median seconds of the plain passes and median ratio (plugin pass / plain passes) over
    back-to-back pairs, so that drifting machine load hits both sides alike."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = conv_bn_net(width).to(device)
    batches = [
        (torch.randn(args.batch_size, 3, size, size, device=device), None)
        for _ in range(args.batches)
    ]

    def plain() -> None:
        model.train()
        with torch.no_grad():
            for inputs, _ in batches:
                model(inputs)

    def precise() -> None:
        model.train()
        layers, _ = bn_layers(model)
        recompute_bn_stats(model, layers, batches, lambda batch: model_forward(model, batch))

    plain(), precise()  # warm-up
    plains, ratios = [], []
    for i in range(args.repeats):  # back-to-back pairs, alternating order: load drift cancels
        if i % 2:
            t_precise, t_plain = timed(precise), timed(plain)
        else:
            t_plain, t_precise = timed(plain), timed(precise)
        plains.append(t_plain)
        ratios.append(t_precise / t_plain)
    return statistics.median(plains), statistics.median(ratios), len(bn_layers(model)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier)")
    args, _ = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"precise_bn vs plain train-mode forward passes; {device}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.batches} batches of {args.batch_size}"
    )
    print(f"{'network':<34} {'plain ms':>9} {'precise ms':>11} {'ratio':>7}")
    for width, size in ((16, 32), (32, 32), (64, 32)):
        t_plain, ratio, layers = measure(width, size, args)
        name = f"conv/BN width {width}, {size}x{size}, {layers} BN"
        print(f"{name:<34} {t_plain * 1e3:9.1f} {t_plain * ratio * 1e3:11.1f} {ratio:6.3f}x")
    print("ratio: median of back-to-back pairs; budget <= 1.15x")


if __name__ == "__main__":
    main()

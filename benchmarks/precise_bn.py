"""Precise-BN pass vs the same number of plain train-mode forward passes (budget <= 1.15x).

Both sides run the same pre-collated batches through the same Conv/BN network under no_grad:
the baseline in train mode with nothing else, the plugin's pass with its forward pre-hooks,
float64 moments, mode switching and buffer restore/write-back. Data loading is left out of
both, so the ratio is the plugin's own overhead. Prints best-of-N times and the ratio.
"""

from __future__ import annotations

import argparse
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


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=32, help="image side")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args, _ = parser.parse_known_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = conv_bn_net(args.width).to(device)
    batches = [
        (torch.randn(args.batch_size, 3, args.size, args.size, device=device), None)
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
    t_plain = t_precise = float("inf")
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        t_plain = min(t_plain, best_of(plain, 1))
        t_precise = min(t_precise, best_of(precise, 1))
    print(
        f"precise_bn on {device.type}, torch {torch.__version__}, threads {torch.get_num_threads()}: "
        f"{args.batches} batches of {args.batch_size}x3x{args.size}x{args.size}, width {args.width}, "
        f"{len(bn_layers(model)[0])} BN layers"
    )
    print(f"plain train-mode forward passes: {t_plain * 1e3:8.1f} ms")
    print(f"precise_bn pass:                 {t_precise * 1e3:8.1f} ms")
    print(f"ratio: {t_precise / t_plain:.3f}x (budget <= 1.15x)")


if __name__ == "__main__":
    main()

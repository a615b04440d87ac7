"""Per-iteration overhead of the open step: a GAN's manual ``training_step(batch, optim)``
with two optimizers, and automatic optimization with two optimizers on one loss, each
against the same code written by hand (small MLPs, CPU, one thread).

The hand loops do what hookrun's step does for them: the manual one steps and zeroes each
optimizer after its backward; the automatic one runs forward, backward and both steps.
Rounds run every case in a rotating order; ratios are medians of the ratio within a round
(as ``overhead.py``). Budget (issue 36): the same as the single-optimizer loop, no plugins
<= 1.015x and default plugins <= 1.03x.

    python benchmarks/open_step.py [--iters 2000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from overhead import Timing, measure, report
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hookrun import Runner

BATCH, LATENT, SIDE = 32, 16, 64
BCE = nn.BCEWithLogitsLoss()


class Gan(nn.Module):
    """A generator and a discriminator of one hidden layer each; the step of the GAN example."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(LATENT, 64), nn.ReLU(), nn.Linear(64, SIDE))
        self.discriminator = nn.Sequential(nn.Linear(SIDE, 64), nn.ReLU(), nn.Linear(64, 1))

    def losses(self, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        fake = self.generator(torch.randn(len(real), LATENT))
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        d_loss = BCE(self.discriminator(real), ones) + BCE(self.discriminator(fake.detach()), zeros)
        return fake, d_loss, ones


class ManualGan(Gan):
    def training_step(self, batch, optim):
        fake, d_loss, ones = self.losses(batch[0])
        optim.backward(d_loss)
        optim.step("discriminator")
        g_loss = BCE(self.discriminator(fake), ones)
        optim.backward(g_loss)
        optim.step("generator")
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


class TwoHeads(nn.Module):
    """A body and a head trained by two optimizers on one loss (automatic optimization)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(SIDE, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def data(iters: int, labels: bool) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(iters * BATCH, SIDE, generator=g)
    tensors = (x, torch.randint(0, 10, (len(x),), generator=g)) if labels else (x,)
    return DataLoader(TensorDataset(*tensors), batch_size=BATCH, shuffle=True)


def optimizers(a: nn.Module, b: nn.Module, names: tuple[str, str]) -> dict:
    return {
        names[0]: torch.optim.Adam(a.parameters(), 2e-4, betas=(0.5, 0.999)),
        names[1]: torch.optim.Adam(b.parameters(), 2e-4, betas=(0.5, 0.999)),
    }


def hand_gan(iters: int) -> float:
    import time

    model = Gan()
    opt = optimizers(model.generator, model.discriminator, ("generator", "discriminator"))
    loader, logged = data(iters, labels=False), []  # made before the clock starts, as hookrun's
    start = time.perf_counter()
    for i, (real,) in enumerate(loader):
        fake, d_loss, ones = model.losses(real)
        d_loss.backward()
        opt["discriminator"].step()
        opt["discriminator"].zero_grad(set_to_none=True)
        g_loss = BCE(model.discriminator(fake), ones)
        g_loss.backward()
        opt["generator"].step()
        opt["generator"].zero_grad(set_to_none=True)
        for optimizer in opt.values():  # hookrun clears every gradient after the step
            optimizer.zero_grad(set_to_none=True)
        if (i + 1) % 50 == 0:
            logged.append((d_loss.item(), g_loss.item()))
    return (time.perf_counter() - start) / iters


def hand_two_optimizers(iters: int) -> float:
    import time

    model, criterion = TwoHeads(), nn.CrossEntropyLoss()
    opt = optimizers(model.body, model.head, ("body", "head"))
    loader, logged = data(iters, labels=True), []
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        for optimizer in opt.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if (i + 1) % 50 == 0:
            logged.append(loss.item())
    return (time.perf_counter() - start) / iters


def hookrun_loop(iters: int, gan: bool, default_plugins: bool) -> float:
    from hookrun.hooks.discovery import installed_plugins

    model: nn.Module = ManualGan() if gan else TwoHeads()
    names = ("generator", "discriminator") if gan else ("body", "head")
    parts = (model.generator, model.discriminator) if gan else (model.body, model.head)
    timing = Timing()
    plugins = None if default_plugins else dict.fromkeys(installed_plugins(), False)
    with tempfile.TemporaryDirectory() as work_dir:
        Runner(
            model,
            data(iters, labels=not gan),
            optimizer=optimizers(*parts, names),
            criterion=None if gan else nn.CrossEntropyLoss(),
            max_epochs=1,
            work_dir=work_dir,
            plugins=plugins,
            hooks=[timing],
            writers=("jsonl", "tensorboard") if default_plugins else (),
            log_interval=50,
        ).train()
    return timing.elapsed / iters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ["HOOKRUN_DISABLE_PLUGINS"] = "ema,precise_bn"
    n = args.iters
    for title, hand, gan in (
        ("GAN, manual training_step(batch, optim), two Adam", hand_gan, True),
        ("two optimizers on one loss, automatic", hand_two_optimizers, False),
    ):
        cases = {
            "hand-written loop": lambda hand=hand: hand(n),
            "hookrun, no plugins": lambda gan=gan: hookrun_loop(n, gan, False),
            "hookrun, default plugins": lambda gan=gan: hookrun_loop(n, gan, True),
        }
        report(f"{title}: {n} iterations x {args.repeats} rounds", measure(cases, args.repeats))
        print()


if __name__ == "__main__":
    main()

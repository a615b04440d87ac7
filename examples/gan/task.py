"""The GAN job: a small generator and discriminator on scikit-learn's bundled 8x8 digits.

Two optimizers, returned by the task as a mapping of names, and manual optimization: the
model's ``training_step(batch, optim)`` steps the discriminator, then the generator, through
hookrun's step object, so both steps pass through AMP, clipping, checkpoints and every plugin
(docs/training-step.md).
"""

from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

bce = nn.functional.binary_cross_entropy_with_logits


class DigitsGAN(nn.Module):
    """A generator of 8x8 images (pixels in [-1, 1]) from ``latent`` noise values, and a
    discriminator telling them from real digits; two small MLPs."""

    def __init__(self, latent: int = 16, width: int = 128) -> None:
        super().__init__()
        self.latent = latent
        self.generator = nn.Sequential(
            nn.Linear(latent, width), nn.LeakyReLU(0.2), nn.Linear(width, 64), nn.Tanh()
        )
        self.discriminator = nn.Sequential(
            nn.Linear(64, width), nn.LeakyReLU(0.2), nn.Linear(width, 1)
        )

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        """Images from noise: what the exported (EMA) generator is used for."""
        return self.generator(noise).view(-1, 8, 8)

    def training_step(self, batch: Any, optim: Any) -> dict[str, torch.Tensor]:
        """One discriminator step, then one generator step (the non-saturating loss)."""
        (real,) = batch
        real = real.flatten(1)
        noise = torch.randn(len(real), self.latent, device=real.device)
        fake = self.generator(noise)
        ones = torch.ones(len(real), 1, device=real.device)
        zeros = torch.zeros_like(ones)

        d_loss = bce(self.discriminator(real), ones) + bce(self.discriminator(fake.detach()), zeros)
        optim.backward(d_loss)
        optim.step("discriminator")

        # the discriminator's gradients from this loss are not used: hookrun clears every
        # gradient after the step, so none reaches the next iteration
        g_loss = bce(self.discriminator(fake), ones)
        optim.backward(g_loss)
        optim.step("generator")
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


def digits_images() -> TensorDataset:
    """The 1,797 digits as 8x8 images scaled to [-1, 1] (the generator's tanh range)."""
    images = torch.tensor(load_digits().images, dtype=torch.float32) / 8.0 - 1.0
    return TensorDataset(images)


def build(
    batch_size: int = 64,
    latent: int = 16,
    width: int = 128,
    lr: float = 2e-4,
    num_threads: int | None = 1,
) -> dict[str, Any]:
    """Model, loader and the two optimizers by name (Adam with beta1 0.5, as DCGAN). No
    criterion: the loss is the model's ``training_step``. ``num_threads``: layers this small
    run fastest on one CPU thread; null keeps torch's choice."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model = DigitsGAN(latent, width)
    return {
        "model": model,
        "train_dataloader": DataLoader(digits_images(), batch_size=batch_size, shuffle=True),
        "optimizer": {
            "generator": torch.optim.Adam(model.generator.parameters(), lr, betas=(0.5, 0.999)),
            "discriminator": torch.optim.Adam(
                model.discriminator.parameters(), lr, betas=(0.5, 0.999)
            ),
        },
    }

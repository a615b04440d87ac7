"""The language-model job: a tiny character-level causal transformer that computes its own
loss, as a Hugging Face causal LM does.

No ``training_step`` and no criterion: hookrun calls ``model(**batch)`` on each padded mapping
batch (``input_ids``, ``attention_mask``, ``labels`` with -100 at padding) and
back-propagates the output's ``loss``. The output also reports ``num_items``, the label
tokens that are not padding, so ``grad_accum_normalize: items`` divides each accumulation
group's summed loss by its tokens, as Hugging Face's Trainer does with
``num_items_in_batch`` (docs/training-step.md).

The text is made here: short sentences of a small grammar, so nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

IGNORE = -100  # labels hookrun's loss ignores: padding, as in Hugging Face
PAD = 0  # the padding token id
SUBJECTS = ["the cat", "a dog", "my bird", "the old fox", "a small mouse"]
VERBS = ["sees", "chases", "likes", "finds", "hears"]
OBJECTS = ["the ball", "a red hat", "the moon", "some cheese", "a tall tree"]


def sentences(count: int, seed: int) -> list[str]:
    """``count`` sentences of the grammar subject verb object, of varied length."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}." for _ in range(count)
    ]


CHARS = sorted(set("".join(SUBJECTS + VERBS + OBJECTS) + " ."))
VOCAB = len(CHARS) + 2  # the characters, padding (0) and the start token (1)


def encode(text: str) -> list[int]:
    """Token ids: the start token, then one id per character."""
    return [1] + [CHARS.index(c) + 2 for c in text]


def collate(samples: list[list[int]]) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``labels`` are the ids with -100 at padding; the model shifts them."""
    width = max(map(len, samples))
    ids = torch.full((len(samples), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample)] = torch.tensor(sample)
        mask[row, : len(sample)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE)}


@dataclasses.dataclass
class LMOutput:
    """What the forward returns: the mean loss over the label tokens, the logits and
    ``num_items``, the label tokens the mean is over."""

    loss: torch.Tensor
    logits: torch.Tensor
    num_items: torch.Tensor


class TinyCausalLM(nn.Module):
    """One pre-norm transformer layer with a causal mask; about 12 thousand parameters."""

    def __init__(self, dim: int = 32, heads: int = 2, context: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Embedding(context, dim)
        self.layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = nn.Linear(dim, VOCAB)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor
    ) -> LMOutput:
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.position(torch.arange(length, device=input_ids.device))
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        x = self.layer(x, src_mask=causal, src_key_padding_mask=attention_mask == 0)
        logits = self.head(x)
        targets = labels[:, 1:]  # token t predicts token t + 1
        loss = nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORE
        )
        return LMOutput(loss, logits, num_items=(targets != IGNORE).sum())


def next_char_accuracy(outputs: LMOutput, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Share of label tokens predicted exactly (a metric receives the outputs and the batch)."""
    targets = batch["labels"][:, 1:]
    hits = (outputs.logits[:, :-1].argmax(-1) == targets) & (targets != IGNORE)
    return hits.sum() / (targets != IGNORE).sum()


def build(
    batch_size: int = 8, train_size: int = 512, num_threads: int | None = 1
) -> dict[str, Any]:
    """Model, padded loaders and the metric; the optimizer is the config's."""
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    train = [encode(s) for s in sentences(train_size, seed=0)]
    val = [encode(s) for s in sentences(128, seed=1)]
    return {
        "model": TinyCausalLM(),
        "train_dataloader": DataLoader(train, batch_size, shuffle=True, collate_fn=collate),
        "val_dataloader": DataLoader(val, 64, collate_fn=collate),
        "metrics": {"next_char_accuracy": next_char_accuracy},
    }

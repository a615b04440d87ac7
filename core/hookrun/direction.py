"""Which way a metric improves, decided from its name: the one rule behind every ``rule: auto``.

The name is split into words on ``_ / . -``; known words are matched whole (``top1_error`` is
``top1`` + ``error``, never the ``err`` inside ``terrain``), and the last known word decides.
"""

from __future__ import annotations

import re
from typing import Literal

Rule = Literal["greater", "less"]

GREATER_WORDS = frozenset(
    {
        "acc", "accuracy", "top1", "top5", "f1", "auc", "auroc", "ap", "map", "iou", "miou",
        "dice", "psnr", "ssim", "precision", "recall", "bleu", "rouge", "r2", "score",
        "kappa", "ndcg", "mrr", "jaccard", "sensitivity", "specificity",
    }
)  # fmt: skip
LESS_WORDS = frozenset(
    {
        "loss", "error", "err", "wer", "cer", "fid", "kid", "mae", "mse", "rmse", "mape",
        "nll", "perplexity", "ppl", "lpips", "eer",
    }
)  # fmt: skip
_SEPARATORS = re.compile(r"[_/.\-]+")


def metric_rule(name: str) -> Rule | None:
    """``"greater"`` or ``"less"`` from the last known word of ``name``; None when no word is
    known (the caller then asks the user for an explicit ``rule``)."""
    for word in reversed(_SEPARATORS.split(name.lower())):
        if word in GREATER_WORDS:
            return "greater"
        if word in LESS_WORDS:
            return "less"
    return None


def resolve_rule(name: str, rule: str) -> Rule:
    """``rule`` when it is ``"greater"`` or ``"less"``; for ``"auto"`` the rule of ``name``'s
    words, or a ValueError asking for an explicit rule (never a guess): the one message every
    plugin with a ``rule: auto`` setting gives."""
    if rule in ("greater", "less"):
        return rule  # type: ignore[return-value]
    decided = metric_rule(name)
    if decided is None:
        raise ValueError(
            f"cannot tell from the metric name {name!r} whether greater or less is better; "
            "set rule: greater or rule: less"
        )
    return decided


def better(rule: Rule, new: float, old: float, min_delta: float = 0.0) -> bool:
    """Whether ``new`` beats ``old`` by more than ``min_delta`` in the direction of ``rule``."""
    return new < old - min_delta if rule == "less" else new > old + min_delta

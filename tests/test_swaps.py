"""hookrun.swap_stack: swaps into one model come out newest first, whatever order the
plugins ask in, and each keeps its own weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hookrun import swap_stack


class Weights:
    """Puts ``value`` into the model's weight, keeping aside what it held."""

    def __init__(self, model: nn.Linear, value: float, log: list[str]) -> None:
        self.model, self.log, self.name = model, log, str(value)
        self.mine = torch.full_like(model.weight, value)
        self.kept: torch.Tensor | None = None

    def swap_in(self) -> None:
        self.kept = self.model.weight.detach().clone()
        self.model.weight.data.copy_(self.mine)
        self.log.append(f"in {self.name}")

    def swap_out(self) -> None:
        assert self.kept is not None
        self.mine = self.model.weight.detach().clone()  # edits made meanwhile stay its own
        self.model.weight.data.copy_(self.kept)
        self.log.append(f"out {self.name}")


def test_out_of_order_removal_unwinds_newest_first_and_keeps_each_swap_its_weights() -> None:
    model = nn.Linear(2, 2)
    trained = model.weight.detach().clone()
    log: list[str] = []
    stack = swap_stack(model)
    assert swap_stack(model) is stack and swap_stack(nn.Linear(2, 2)) is not stack
    a, b, c = (Weights(model, v, log) for v in (1.0, 2.0, 3.0))
    for swap in (a, b, c):
        stack.push(swap)
    assert torch.equal(model.weight, c.mine)

    with stack.exposed(a):  # a's weights, b and c aside
        assert torch.equal(model.weight, torch.full_like(trained, 1.0))
    with stack.exposed():  # the trained weights
        assert torch.equal(model.weight, trained)
    assert torch.equal(model.weight, torch.full_like(trained, 3.0))

    log.clear()
    stack.remove(a)  # asked in the order they came in, as after_val hooks run
    assert log == ["out 3.0", "out 2.0", "out 1.0", "in 2.0", "in 3.0"]
    assert torch.equal(model.weight, torch.full_like(trained, 3.0))
    model.weight.data.fill_(7.0)  # an edit to the swap on top (a statistics pass)
    stack.remove(b)
    stack.remove(c)
    assert stack.entries == [] and torch.equal(model.weight, trained)
    assert (a.mine[0, 0], b.mine[0, 0], c.mine[0, 0]) == (1.0, 2.0, 7.0)
    with pytest.raises(ValueError, match="is not swapped into this model"):
        stack.remove(a)

"""The open training step (docs/training-step.md): a model that computes its own loss, several
optimizers with manual optimization, accumulation normalised by items, ``transform_batch``,
any batch moved, and one line for a batch or output that does not fit the convention in use.
Each number is checked against a hand-written loop over the same data."""

from __future__ import annotations

import collections
import dataclasses
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from _support import run, write
from hookrun import Runner, hookimpl
from hookrun.data.batches import to_device
from hookrun.engine.steps import StepError
from hookrun.errors import ConfigError

VOCAB, PAD = 11, -100


# -- a model that computes its own loss ---------------------------------------------------


class TinyLM(nn.Module):
    """``forward(input_ids, labels)`` returning an object with ``.loss`` (and ``num_items``,
    the label tokens that are not padding), as a Hugging Face causal LM does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=PAD
        )
        return SimpleNamespace(loss=loss, logits=logits, num_items=(labels != PAD).sum())


def lm_batches(count: int = 8, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Mapping batches of 2 sequences of 6 tokens, each padded after a random length."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (2, 6), generator=g)
        lengths = torch.randint(1, 7, (2,), generator=g)
        labels = torch.where(torch.arange(6) < lengths[:, None], ids, torch.tensor(PAD))
        batches.append({"input_ids": ids, "labels": labels})
    return batches


def lm_loader(batches: list[dict[str, torch.Tensor]]) -> DataLoader:
    return DataLoader(batches, batch_size=None, shuffle=False)


class Losses:
    """Records every iteration's loss."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    @hookimpl
    def after_train_iter(self, outputs: dict[str, torch.Tensor]) -> None:
        self.losses.append(outputs["loss"].clone())


def test_a_model_that_computes_its_loss_trains_from_mapping_batches_as_a_hand_loop(
    tmp_path: Path,
) -> None:
    batches = lm_batches()
    model, seen = TinyLM(), Losses()
    runner = Runner(
        model=model,
        train_dataloader=lm_loader(batches),
        optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_epochs=2,
        work_dir=tmp_path / "run",
        writers=(),
        hooks=[seen],
    )
    runner.train()

    reference = TinyLM()
    opt = torch.optim.AdamW(reference.parameters(), lr=0.01)
    expected = []
    for _ in range(2):
        for batch in batches:
            loss = reference(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            expected.append(loss.detach())
    assert len(seen.losses) == 16
    assert all(torch.equal(a, b) for a, b in zip(seen.losses, expected, strict=True))
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    metrics = runner.evaluate(lm_loader(batches))
    assert set(metrics) == {"loss"}  # validation reports the model's own loss


# -- accumulation normalised by items ----------------------------------------------------


def test_items_normalisation_equals_the_group_summed_loss_over_its_items(tmp_path: Path) -> None:
    """grad_accum 4 over padded batches: each group's gradient is that of its summed token
    loss divided by its tokens, checked against a float64 loop that computes exactly that."""
    batches = lm_batches(8, seed=3)
    model = TinyLM()
    Runner(
        model=model,
        train_dataloader=lm_loader(batches),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        max_epochs=1,
        grad_accum=4,
        grad_accum_normalize="items",
        work_dir=tmp_path / "run",
        writers=(),
    ).train()

    reference = TinyLM().double()
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for start in (0, 4):
        group = batches[start : start + 4]
        total = torch.zeros((), dtype=torch.float64)
        for batch in group:
            logits = reference.head(reference.embed(batch["input_ids"]))
            total = total + nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB),
                batch["labels"].reshape(-1),
                ignore_index=PAD,
                reduction="sum",
            )
        items = sum(int((b["labels"] != PAD).sum()) for b in group)
        (total / items).backward()
        opt.step()
        opt.zero_grad()
    for trained, exact in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(trained.double(), exact, rtol=0, atol=1e-6)

    # the mean of the micro-batch means (grad_accum_normalize: batches) is another number
    batches_model = TinyLM()
    Runner(
        model=batches_model,
        train_dataloader=lm_loader(batches),
        optimizer=torch.optim.SGD(batches_model.parameters(), lr=0.5),
        max_epochs=1,
        grad_accum=4,
        work_dir=tmp_path / "other",
        writers=(),
    ).train()
    assert not torch.allclose(batches_model.head.weight.double(), reference.head.weight, atol=1e-4)


def test_items_normalisation_without_num_items_is_one_line(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    data = [(torch.randn(2, 4), torch.tensor([0, 1]))] * 2
    runner = Runner(
        model=model,
        train_dataloader=DataLoader(data, batch_size=None),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        criterion=nn.CrossEntropyLoss(),
        grad_accum=2,
        grad_accum_normalize="items",
        max_epochs=1,
        work_dir=tmp_path / "run",
        writers=(),
    )
    with pytest.raises(StepError, match="outputs hold no num_items"):
        runner.train()


# -- several optimizers, manual optimization ---------------------------------------------


class GAN(nn.Module):
    """A generator of 2-d points and a discriminator; ``training_step(batch, optim)`` updates
    D on every batch and G on every second one, as GAN code often does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
        self.calls = 0

    def losses(self, real: torch.Tensor, noise: torch.Tensor) -> tuple[Any, Any]:
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.generator(noise)
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        d_loss = bce(self.discriminator(real), ones) + bce(self.discriminator(fake.detach()), zeros)
        return d_loss, lambda: bce(self.discriminator(fake), ones)

    def training_step(self, batch: Any, optim: Any) -> dict[str, torch.Tensor]:
        real, noise = batch
        d_loss, g_loss_of = self.losses(real, noise)
        optim.backward(d_loss)
        optim.step("discriminator")
        out = {"loss": d_loss.detach()}
        if self.calls % 2 == 1:
            g_loss = g_loss_of()
            optim.backward(g_loss)
            optim.step("generator")
            out["g_loss"] = g_loss.detach()
        self.calls += 1
        return out


def gan_data(count: int = 10) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(4, 2, generator=g) + 2, torch.randn(4, 3, generator=g)) for _ in range(count)
    ]


def gan_optimizers(model: GAN) -> dict[str, torch.optim.Optimizer]:
    return {
        "generator": torch.optim.Adam(model.generator.parameters(), lr=1e-2),
        "discriminator": torch.optim.SGD(model.discriminator.parameters(), lr=0.1, momentum=0.9),
    }


class Steps:
    """Records each optimizer step's name, and the names of before_optimizer_step."""

    def __init__(self) -> None:
        self.before: list[str] = []
        self.after: list[str] = []

    @hookimpl
    def before_optimizer_step(self, optimizer_name: str) -> None:
        self.before.append(optimizer_name)

    @hookimpl
    def after_optimizer_step(self, runner: Any, optimizer: Any, optimizer_name: str) -> None:
        assert runner.optimizers[optimizer_name] is optimizer
        self.after.append(optimizer_name)


def test_a_manual_gan_with_two_optimizers_equals_a_hand_written_loop(tmp_path: Path) -> None:
    data = gan_data()
    model, steps = GAN(), Steps()
    schedulers = None
    optimizers = gan_optimizers(model)
    schedulers = {"generator": torch.optim.lr_scheduler.StepLR(optimizers["generator"], 2, 0.5)}
    runner = Runner(
        model=model,
        train_dataloader=DataLoader(data, batch_size=None),
        optimizer=optimizers,
        scheduler=schedulers,
        scheduler_interval="iter",
        max_epochs=2,
        work_dir=tmp_path / "run",
        writers=(),
        hooks=[steps],
    )
    runner.train()

    reference = GAN()
    opts = gan_optimizers(reference)
    sched = torch.optim.lr_scheduler.StepLR(opts["generator"], 2, 0.5)
    for _ in range(2):
        for real, noise in data:
            opts["discriminator"].zero_grad()
            d_loss, g_loss_of = reference.losses(real, noise)
            d_loss.backward()
            opts["discriminator"].step()
            if reference.calls % 2 == 1:
                opts["generator"].zero_grad()
                g_loss_of().backward()
                opts["generator"].step()
                sched.step()
            reference.calls += 1
    for trained, exact in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(trained, exact, rtol=0, atol=1e-6)
    assert steps.after.count("discriminator") == 20 and steps.after.count("generator") == 10
    assert steps.before == steps.after
    assert runner.position.optimizer_steps == {"generator": 10, "discriminator": 20}
    assert all(p.grad is None for p in model.parameters())  # nothing left to the next step


def test_a_resumed_gan_continues_both_optimizers_exactly(tmp_path: Path) -> None:
    """Saved at iteration 7 of 20 and resumed in a new Runner: the weights and both
    optimizers' states end bit-identical to the run never interrupted."""

    class SaveAt:
        @hookimpl
        def after_train_iter(self, runner: Any) -> None:
            if runner.iter == 6:
                runner.save_checkpoint(runner.checkpoint_dir / "at_7.pt")

    def gan_runner(work: Path, hooks: list[Any]) -> Runner:
        model = GAN()
        return Runner(
            model=model,
            train_dataloader=DataLoader(gan_data(), batch_size=None),
            optimizer=gan_optimizers(model),
            max_epochs=2,
            work_dir=work,
            writers=(),
            hooks=hooks,
        )

    whole = gan_runner(tmp_path / "whole", [])
    whole.train()
    first = gan_runner(tmp_path / "cut", [SaveAt()])
    first.train()
    resumed = gan_runner(tmp_path / "resumed", [])
    resumed.unwrapped_model.calls = 7  # the model's own counter is the model's to keep
    resumed.train(resume=tmp_path / "cut" / "checkpoints" / "at_7.pt")
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    for name in ("generator", "discriminator"):
        states = whole.optimizers[name].state_dict(), resumed.optimizers[name].state_dict()
        for key in states[0]["state"]:
            for field, value in states[0]["state"][key].items():
                assert torch.equal(
                    torch.as_tensor(value), torch.as_tensor(states[1]["state"][key][field])
                )
    assert resumed.position.optimizer_steps == {"generator": 10, "discriminator": 20}


def test_automatic_optimization_steps_every_optimizer_at_each_boundary(tmp_path: Path) -> None:
    torch.manual_seed(0)
    body, head = nn.Linear(4, 4), nn.Linear(4, 2)
    model = nn.Sequential(body, head)
    steps = Steps()
    Runner(
        model=model,
        train_dataloader=DataLoader(
            [(torch.randn(2, 4), torch.tensor([0, 1]))] * 4, batch_size=None
        ),
        optimizer={
            "body": torch.optim.SGD(body.parameters(), lr=0.1),
            "head": torch.optim.SGD(head.parameters(), lr=0.2),
        },
        criterion=nn.CrossEntropyLoss(),
        grad_accum=2,
        max_epochs=1,
        work_dir=tmp_path / "run",
        writers=(),
        hooks=[steps],
    ).train()
    assert steps.after == ["body", "head", "body", "head"]


def test_optimizer_names_that_do_not_fit_are_one_line_before_training(tmp_path: Path) -> None:
    model = GAN()
    optimizers = gan_optimizers(model)
    other = torch.optim.lr_scheduler.StepLR(optimizers["generator"], 2)
    with pytest.raises(ConfigError) as info:
        Runner(model=model, optimizer=optimizers, scheduler={"gen": other}, work_dir=tmp_path / "a")
    assert info.value.lines == [
        "scheduler: 'gen' names no optimizer; the optimizers are 'generator', 'discriminator'"
    ]
    shared = {
        "a": torch.optim.SGD(model.parameters(), lr=1),
        "b": torch.optim.SGD(model.generator.parameters(), lr=1),
    }
    with pytest.raises(ConfigError, match="'a' and 'b' both train a parameter of shape"):
        Runner(model=model, optimizer=shared, work_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="runner.grad_accum: a training_step\\(batch, optim\\)"):
        Runner(model=model, optimizer=optimizers, grad_accum=2, work_dir=tmp_path / "c")
    assert not any(tmp_path.iterdir())


# -- transform_batch and moving batches --------------------------------------------------


class Transform:
    def __init__(self, name: str, priority: int, log: list[Any], change: bool) -> None:
        self.name, self.priority, self.log, self.change = name, priority, log, change

    @hookimpl
    def transform_batch(self, batch: Any, mode: str) -> Any:
        self.log.append((self.name, mode, float(batch[0].sum())))
        if self.change:
            return batch[0] + 1, batch[1]
        return None


def test_transform_batch_chains_in_priority_order_and_none_leaves_the_batch(tmp_path: Path) -> None:
    log: list[Any] = []
    x = torch.zeros(2, 4)
    data = [(x, torch.tensor([0, 1]))]
    seen: list[torch.Tensor] = []

    class Model(nn.Linear):
        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            seen.append(inputs.clone())
            return super().forward(inputs)

    model = Model(4, 2)
    hooks = [
        Transform("second", 60, log, change=True),
        Transform("third", 70, log, change=False),
        Transform("first", 10, log, change=True),
    ]
    Runner(
        model=model,
        train_dataloader=DataLoader(data, batch_size=None),
        val_dataloader=DataLoader(data, batch_size=None),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        criterion=nn.CrossEntropyLoss(),
        max_epochs=1,
        work_dir=tmp_path / "run",
        writers=(),
        hooks=hooks,
    ).train()
    assert log == [
        ("first", "train", 0.0), ("second", "train", 8.0), ("third", "train", 16.0),
        ("first", "val", 0.0), ("second", "val", 8.0), ("third", "val", 16.0),
    ]  # fmt: skip
    assert [float(s.sum()) for s in seen] == [16.0, 16.0]  # the step saw the final batch


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    name: str = "a"


class Movable:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def to(self, device: torch.device) -> Movable:
        return Movable(self.tensor.to(device))


def test_every_kind_of_batch_is_moved_to_the_device() -> None:
    meta = torch.device("meta")
    t = torch.ones(2)
    moved = to_device(
        {"pair": Pair(t, t), "sample": Sample(t, t), "obj": Movable(t), "list": [t, (t,)], "n": 3},
        meta,
    )
    assert moved["pair"].x.is_meta and isinstance(moved["pair"], Pair)
    assert moved["sample"].image.is_meta and moved["sample"].label.is_meta
    assert moved["sample"].name == "a" and isinstance(moved["sample"], Sample)
    assert moved["obj"].tensor.is_meta
    assert moved["list"][0].is_meta and moved["list"][1][0].is_meta and moved["n"] == 3


def test_mappings_keep_their_kind_when_moved() -> None:
    """A defaultdict keeps its factory, an OrderedDict its order, a read-only mapping its
    class: the step receives the kind the loader yielded."""
    meta = torch.device("meta")
    t = torch.ones(2)
    counts = to_device(collections.defaultdict(list, x=t), meta)
    assert type(counts) is collections.defaultdict and counts.default_factory is list
    assert counts["x"].is_meta and counts["missing"] == []
    ordered = to_device(collections.OrderedDict([("b", t), ("a", t)]), meta)
    assert type(ordered) is collections.OrderedDict and list(ordered) == ["b", "a"]
    assert ordered["a"].is_meta
    frozen = to_device(types.MappingProxyType({"x": t}), meta)
    assert frozen["x"].is_meta


# -- bad input from the CLI: one line, exit 2, nothing written ---------------------------

TASK = """
import torch
from torch import nn
from torch.utils.data import DataLoader


class Classifier(nn.Linear):
    def __init__(self):
        super().__init__(4, 2)


def build(kind):
    torch.manual_seed(0)
    model = Classifier()
    mapping = [{"x": torch.randn(2, 4), "y": torch.tensor([0, 1])}] * 3
    pairs = [(torch.randn(2, 4), torch.tensor([0, 1]))] * 3
    task = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    if kind == "criterion_with_mappings":
        loader = DataLoader(mapping, batch_size=None)
        task.update(train_dataloader=loader, criterion=nn.CrossEntropyLoss())
    if kind == "no_loss":
        inputs = [{"input": torch.randn(2, 4)}] * 3
        task.update(train_dataloader=DataLoader(inputs, batch_size=None))
    if kind == "pairs_without_criterion":
        task.update(train_dataloader=DataLoader(pairs, batch_size=None))
    if kind == "mapping_after_two_pairs":  # two iterations train, the third batch misfits
        late = DataLoader(pairs[:2] + mapping[:1], batch_size=None)
        task.update(train_dataloader=late, criterion=nn.CrossEntropyLoss())
    if kind == "mappings_to_validate":  # an epoch trains, its validation misfits
        task.update(
            train_dataloader=DataLoader(pairs, batch_size=None),
            val_dataloader=DataLoader(mapping, batch_size=None),
            criterion=nn.CrossEntropyLoss(),
        )
    return task
"""


def train_step_task(tmp_path: Path, kind: str) -> Any:
    """``hookrun train`` of :data:`TASK` built as ``kind``, one epoch, into ``tmp_path/run``."""
    write(tmp_path / "steptask.py", TASK)
    config = write(
        tmp_path / "run.yaml",
        f"task: steptask.py:build\ntask_args: {{kind: {kind}}}\n"
        "runner: {max_epochs: 1, device: cpu, writers: []}\n",
    )
    return run("train", config, "--work-dir", tmp_path / "run", cwd=tmp_path)


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (
            "criterion_with_mappings",
            "criterion: batches are (inputs, targets) and the loss is "
            "criterion(model(inputs), targets); got a dict with keys ['x', 'y']: drop criterion "
            "to let the model compute its loss (model(**batch) for a mapping), or define "
            "training_step(batch) on the model",
        ),
        (
            "no_loss",
            "Classifier returned a tensor of shape [2, 2] with no 'loss' (the model "
            "computes its loss: model(**batch) for a mapping batch, else model(batch)); define "
            "training_step(batch) on the model, or pass criterion=...",
        ),
        (
            "pairs_without_criterion",
            "Classifier cannot take a list of 2 (the model computes its loss: model(**batch) "
            "for a mapping batch, else model(batch)): TypeError: linear(): argument 'input' "
            "(position 1) must be Tensor, not list; define training_step(batch) on the model, "
            "or pass criterion=...",
        ),
    ],
)
def test_a_batch_or_output_that_does_not_fit_is_one_line_exit_2_and_nothing_saved(
    tmp_path: Path, kind: str, line: str
) -> None:
    proc = train_step_task(tmp_path, kind)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == line
    assert "Traceback" not in proc.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


@pytest.mark.parametrize("kind", ["mapping_after_two_pairs", "mappings_to_validate"])
def test_a_misfit_after_iterations_trained_writes_no_emergency_checkpoint(
    tmp_path: Path, kind: str
) -> None:
    """Bad input is bad input at any iteration: one line, exit 2, and the checkpoint plugin
    saves nothing for it (the epoch's own checkpoint, due before its validation, stays)."""
    proc = train_step_task(tmp_path, kind)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("criterion: batches are (inputs, ")
    checkpoints = tmp_path / "run" / "checkpoints"
    saved = sorted(p.name for p in checkpoints.iterdir()) if checkpoints.exists() else []
    assert saved == ([] if kind == "mapping_after_two_pairs" else ["epoch_1.pt", "latest"])

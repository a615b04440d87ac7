"""``hookrun schedule``: the learning rate (and momentum) of every iteration of a run,
computed by stepping the run's own optimizers and schedulers as the training loop does,
without a forward or backward pass; a compact console table and an optional PNG. With
several optimizers each has its columns, named as the run logs them (``train/lr/<name>``).

Also how a resumed run continues its schedule (:func:`continue_schedule`): a longer run is
a longer schedule, so what ``hookrun schedule`` shows for the resumed config is what the
run logs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hookrun.engine.position import DEFAULT_MAX_EPOCHS, Phase, group_ends
from hookrun.errors import ConfigError, HookrunError

if TYPE_CHECKING:
    import torch

    from hookrun.config.file import LoadedConfig


def check_plot_extra() -> None:
    """``--plot`` needs matplotlib (the ``plot`` extra): say so before any work, naming the
    library itself (hookrun is not on the package index: ``hookrun[plot]`` cannot be
    installed from it)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise HookrunError(
            "--plot: needs matplotlib, which is not installed; pip install matplotlib"
        )


def compute(loaded: LoadedConfig) -> list[ScheduledIter]:
    """Build the task (model, loaders, optimizers, schedules) as ``hookrun train`` does and
    step its schedules through the whole run."""
    from hookrun.cli.build import build_task
    from hookrun.data.streams import sized
    from hookrun.engine.optimizer_step import named_optimizers

    objects = build_task(loaded, training=True)
    runner = loaded.runner
    batches = sized(objects["train_dataloader"])
    if batches is None:  # a stream: its epochs end when its iterator does
        if not runner["max_iters"] or runner["scheduler_interval"] != "iter":
            raise ConfigError(
                f"runner: task {loaded.data['task']}'s train_dataloader is a stream (no "
                "length), so the run's iterations are known only as it trains; give "
                "runner.max_iters and scheduler_interval: iter to see its schedule"
            )
        batches = runner["max_iters"]
    max_iters = runner["max_iters"] or (runner["max_epochs"] or DEFAULT_MAX_EPOCHS) * batches
    optimizers, schedulers = named_optimizers(objects["optimizer"], objects.get("scheduler"))
    return list(
        simulate(
            optimizers,
            schedulers,
            batches,
            max_iters,
            runner["grad_accum"],
            runner["scheduler_interval"],
        )
    )


class Rates(NamedTuple):
    """One optimizer's learning rates and momenta, a value per parameter group (momenta
    only where the optimizer has one)."""

    lrs: tuple[float, ...]
    momenta: tuple[float, ...]


@dataclass(frozen=True)
class ScheduledIter:
    """The learning rates (and momenta) one training iteration steps with, by optimizer
    name (``main`` when there is one)."""

    iter: int  # 1-based: the ``step`` a JSONL record of this iteration carries
    epoch: int  # 1-based, as the console counts (``runner.epoch + 1``)
    rates: dict[str, Rates]

    @property
    def lrs(self) -> tuple[float, ...]:
        """Every parameter group's learning rate, optimizer after optimizer."""
        return tuple(lr for rates in self.rates.values() for lr in rates.lrs)

    @property
    def momenta(self) -> tuple[float, ...]:
        """Every parameter group's momentum, optimizer after optimizer."""
        return tuple(m for rates in self.rates.values() for m in rates.momenta)


def simulate(
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    batches_per_epoch: int,
    max_iters: int,
    grad_accum: int,
    interval: str,
) -> Iterator[ScheduledIter]:
    """Step the schedulers as automatic optimization does (every optimizer steps at each
    accumulation boundary, each scheduler after its optimizer, or after each complete
    epoch), with no gradient and so no change to any weight; yield every iteration's
    learning rates. ``optimizer.step()`` with no gradients is a no-op."""
    done, epoch = 0, 0
    while done < max_iters:
        for batch_idx in range(batches_per_epoch):
            yield ScheduledIter(
                done + 1,
                epoch + 1,
                {name: _rates(optimizer) for name, optimizer in optimizers.items()},
            )
            done += 1
            boundary = group_ends(batch_idx + 1, batches_per_epoch, grad_accum)
            if boundary and interval == "iter":
                _step(optimizers, schedulers)
            if done >= max_iters:
                break
        else:
            if interval == "epoch":
                _step(optimizers, schedulers)
        epoch += 1


def _step(optimizers: Mapping[str, torch.optim.Optimizer], schedulers: Mapping[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, scheduler in schedulers.items():
            optimizers[name].step()
            scheduler.step()


def _rates(optimizer: torch.optim.Optimizer) -> Rates:
    groups = optimizer.param_groups
    momenta = [_momentum(g) for g in groups]
    return Rates(tuple(float(g["lr"]) for g in groups), tuple(m for m in momenta if m is not None))


#: Entries of a scheduler's state that count its progress; the others describe the schedule
#: (``T_cur`` and ``T_i``: where ``CosineAnnealingWarmRestarts`` stands in its cycle).
PROGRESS = frozenset(
    {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial"}
    | {"T_cur", "T_i"}
)


def scheduler_entries(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's entries that are not the optimizer's own hyper-parameters: what
    its schedulers keep there (``initial_lr``; ``OneCycleLR``'s ``max_lr`` and ``min_lr``)."""
    own = {"params", *optimizer.defaults}
    return [{k: v for k, v in group.items() if k not in own} for group in optimizer.param_groups]


def continue_schedule(
    runner: Any, name: str, saved: Mapping[str, Any], built: list[dict[str, Any]]
) -> str | None:
    """Continue ``saved`` (a checkpoint's state of the scheduler ``name``) with the one this
    run built and has not stepped, once the run's position is restored. The same schedule
    is loaded as saved (exact). A schedule that differs (``auto`` lengths, warm-up or total
    steps recomputed for another ``max_epochs``/``max_iters`` or number of ranks, or values
    changed in the config) is this run's, stepped from its start to the run's position, so
    each later iteration's learning rate is the one ``hookrun schedule`` gives for it; its
    entries in the param groups are this run's (``built``, by :func:`scheduler_entries`
    before the checkpoint's optimizer state was loaded). Returns the line that says so then."""
    import torch

    scheduler = runner.schedulers.get(name)
    if scheduler is None:
        return None
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    if plateau or _described(scheduler.state_dict()) == _described(saved):
        scheduler.load_state_dict(saved)
        return None
    steps = steps_taken(runner, name)
    groups = scheduler.optimizer.param_groups
    for group, entries in zip(groups, built, strict=False):
        group.update(entries)  # the optimizer's state brought the saved schedule's
    for group, lr in zip(groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "step() before optimizer.step()": none is due
            for _ in range(steps - int(scheduler.last_epoch)):
                scheduler.step()
    except Exception as exc:
        raise HookrunError(
            f"scheduler: the schedule of this run's settings cannot continue at step {steps}: {exc}"
        ) from None
    return (
        "the schedule differs from the checkpoint's (the run's length or the scheduler's "
        f"settings): it continues at step {steps} of this run's schedule, as `hookrun "
        "schedule` shows it"
    )


def steps_taken(runner: Any, name: str) -> int:
    """The steps the training loop has taken of the scheduler ``name`` up to
    ``runner.position``: its optimizer's steps (``position.optimizer_steps``) or the
    complete epochs."""
    pos, per_epoch = runner.position, runner._batches_per_epoch()
    done = pos.phase is not Phase.TRAIN if per_epoch is None else pos.batch >= per_epoch
    if runner.scheduler_interval == "epoch":
        return pos.epoch + int(done and pos.phase is not Phase.TRAIN)
    return int(pos.optimizer_steps.get(name, 0))


def _described(state: Any) -> Any:
    """``state`` without its progress, tensors as lists, for comparing two schedules."""
    import torch

    if isinstance(state, Mapping):
        return {k: _described(v) for k, v in state.items() if k not in PROGRESS}
    if isinstance(state, (list, tuple)):
        return [_described(v) for v in state]
    if isinstance(state, torch.Tensor):
        return state.tolist()
    return state


def _momentum(group: Mapping[str, Any]) -> float | None:
    if "betas" in group:
        return float(group["betas"][0])
    if "momentum" in group:
        return float(group["momentum"])
    return None


def as_json(step: ScheduledIter) -> dict[str, Any]:
    """One iteration for ``--json``: ``lr`` and ``momentum`` per group; with several
    optimizers, mappings of their names to those lists."""
    if len(step.rates) == 1:
        return {"iter": step.iter, "epoch": step.epoch, "lr": step.lrs, "momentum": step.momenta}
    return {
        "iter": step.iter,
        "epoch": step.epoch,
        "lr": {name: rates.lrs for name, rates in step.rates.items()},
        "momentum": {name: rates.momenta for name, rates in step.rates.items()},
    }


def table_header(steps: list[ScheduledIter]) -> list[str]:
    """``lr`` (and ``momentum``) for one optimizer; with several, ``lr/<name>`` (and
    ``momentum/<name>``) for each: the names the run logs under ``train/``."""
    names = list(steps[0].rates) if steps else []
    several = len(names) > 1
    header = ["iter", "epoch"] + [f"lr/{name}" if several else "lr" for name in names]
    return header + [
        f"momentum/{name}" if several else "momentum"
        for name in names
        if any(s.rates[name].momenta for s in steps)
    ]


def table_rows(steps: list[ScheduledIter], rows: int = 16) -> list[list[str]]:
    """About ``rows`` iterations, evenly spread, with the first and last and every one at
    which the learning rate stops rising (a warm-up's end); the columns of
    :func:`table_header`."""
    if not steps:
        return []
    picked = {0, len(steps) - 1}
    picked |= {round(i * (len(steps) - 1) / (rows - 1)) for i in range(rows)}
    picked |= {
        i for i in range(1, len(steps) - 1) if steps[i - 1].lrs < steps[i].lrs >= steps[i + 1].lrs
    }
    names = list(steps[0].rates)
    moving = [name for name in names if any(s.rates[name].momenta for s in steps)]
    table = []
    for i in sorted(picked):
        step = steps[i]
        row = [str(step.iter), str(step.epoch)]
        row += [_numbers(step.rates[name].lrs) for name in names]
        row += [_numbers(step.rates[name].momenta) for name in moving]
        table.append(row)
    return table


def plot(steps: list[ScheduledIter], path: Path, title: str) -> None:
    """The learning rate of each optimizer's groups (and each one's first momentum, dashed,
    on a second axis) over the run's iterations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    iters = [s.iter for s in steps]
    names = list(steps[0].rates) if steps else []
    label = "{name} group {group}" if len(names) > 1 else "lr group {group}"
    for name in names:
        for group in range(len(steps[0].rates[name].lrs)):
            lrs = [s.rates[name].lrs[group] for s in steps]
            axis.plot(iters, lrs, label=label.format(name=name, group=group))
    axis.set_xlabel("iteration")
    axis.set_ylabel("learning rate")
    axis.set_title(title)
    moving = [name for name in names if steps[0].rates[name].momenta]
    if moving:
        other = axis.twinx()
        for name in moving:
            momenta = [s.rates[name].momenta[0] for s in steps]
            other.plot(iters, momenta, color="grey", linestyle="--")
        other.set_ylabel("momentum", color="grey")
    axis.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _numbers(values: tuple[float, ...]) -> str:
    shown = dict.fromkeys(f"{v:.6g}" for v in values)
    return " / ".join(shown) if shown else "-"

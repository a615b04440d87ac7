"""``hookrun config validate|schema`` and ``hookrun schedule``: a config checked, described and
its learning-rate schedule printed, without training."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from hookrun.cli.console import aligned, echo, to_json
from hookrun.cli.options import (
    Command,
    CommandGroup,
    PathType,
    check_place,
    config_argument,
    notice,
    path_name,
    set_option,
)


@click.group(name="config", cls=CommandGroup)
def config_group() -> None:
    """Check config files and print their JSON Schema."""


@config_group.command(name="validate")
@config_argument
@set_option
def config_validate(config: Path, overrides: Sequence[str]) -> None:
    """Check CONFIG (and overrides) without training: exit 0 when valid, otherwise 2 with
    one line per error.

    Checks everything the config alone decides (on this machine: devices), with the
    lines train gives. What needs the task or the launch is train's to check: the task's
    return value, a warm-up against a run length that depends on the train_dataloader's
    batches an epoch, the scheduler's values against the task's optimizer or the model's
    parameter groups, strategy fsdp in a single process, a work dir already holding a run.
    """
    from hookrun.config import file as cfg

    loaded = cfg.load(config, overrides)
    named = [name for name, value in loaded.data["plugins"].items() if value is not False]
    echo(f"{config}: valid (task {loaded.data['task']}; plugins named: {', '.join(named) or '-'})")


@click.command(cls=Command)
@config_argument
@set_option
@click.option(
    "--plot",
    type=PathType(dir_okay=False, path_type=Path),
    metavar="PNG",
    callback=path_name,
    help="Also draw the schedule into this PNG file (needs the plot extra: matplotlib).",
)
@click.option("--json", "as_json", is_flag=True, help="Every iteration as JSON.")
def schedule(config: Path, overrides: Sequence[str], plot: Path | None, as_json: bool) -> None:
    """The learning rate (and momentum) over the whole run of CONFIG, without training."""
    from hookrun.config import file as cfg
    from hookrun.config import schedule as lr_schedule

    loaded = cfg.load(config, overrides)
    if plot is not None:
        check_place("--plot", plot, folder=False)
        lr_schedule.check_plot_extra()
    if not as_json:  # machine-readable output holds nothing else
        notice(f"building task {loaded.data['task']} ...")
    steps = lr_schedule.compute(loaded)
    if as_json:
        echo(to_json([lr_schedule.as_json(s) for s in steps]))
    else:
        echo(aligned(lr_schedule.table_rows(steps), lr_schedule.table_header(steps)))
        interval = loaded.runner["scheduler_interval"]
        echo(f"{len(steps)} iterations; the schedule steps per {interval}")
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)  # as export creates OUT's folders
        lr_schedule.plot(steps, plot, f"{config} ({len(steps)} iterations)")
        echo(f"wrote {plot}")


@config_group.command(name="schema")
def config_schema() -> None:
    """Print the JSON Schema of config files, installed plugins' settings included."""
    from hookrun.config.schema import schema

    echo(to_json(schema()))

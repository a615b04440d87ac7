"""The run's objects from a validated config: the task called (after seeding), its result
checked, and the optimizer and schedule the config declares built over its model. A
launcher's job, kept apart from :mod:`hookrun.config.task` (which only finds and checks the task)
so that the config file's modules never import what builds from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookrun.config.task import argument_errors, check_task_result, load_task, signature_parameters
from hookrun.errors import ConfigError

if TYPE_CHECKING:
    from hookrun.config.file import LoadedConfig


def build_task(loaded: LoadedConfig, training: bool) -> dict[str, Any]:
    """Import and call the task (after seeding), check what it returned, and add the
    optimizer and scheduler the config declares. ``training``: an optimizer is required."""
    from hookrun.config.optimizers import build_optimizers
    from hookrun.config.schedulers import build_schedulers, run_length, schedule_interval
    from hookrun.data.loaders import seed_all

    data = loaded.data
    task = data["task"]
    build = load_task(task, loaded.path)
    params = signature_parameters(build)
    if params is not None:
        errors = argument_errors(task, params, data["task_args"])
        if errors:
            raise ConfigError(errors)
    seed_all(loaded.runner["seed"])  # before the task builds (and initialises) the model
    declared = {key: data.get(key) for key in ("optimizer", "scheduler")}
    objects = check_task_result(build(**data["task_args"]), task, declared, training)
    if declared["optimizer"] is not None:
        objects["optimizer"] = build_optimizers(objects["model"], declared["optimizer"])
    if declared["scheduler"] is not None and (training or objects.get("train_dataloader")):
        if objects.get("optimizer") is None:
            raise ConfigError("scheduler: there is no optimizer to schedule")
        runner = loaded.runner
        interval = schedule_interval(declared["scheduler"], runner)
        length = run_length(
            _batches(objects.get("train_dataloader"), task),
            runner["max_epochs"],
            runner["max_iters"],
            runner["grad_accum"],
        )
        objects["scheduler"] = build_schedulers(
            objects["optimizer"], declared["scheduler"], length, interval
        )
    return objects


def _batches(loader: Any, task: str) -> int:
    """Batches per epoch of the train loader (per rank under torchrun)."""
    import os

    try:
        count = len(loader)
    except TypeError:
        raise ConfigError(
            f"scheduler: `auto` needs the length of task {task}'s train_dataloader, which "
            "has none; give the scheduler's lengths as numbers"
        ) from None
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return max(1, -(-count // world))

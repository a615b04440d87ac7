"""From a loaded config to a ready Runner: the work-dir check, the task's objects, the saved
resolved config. What ``hookrun train|val|test`` do before the Runner takes over."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hookrun.config.file import LoadedConfig
from hookrun.errors import HookrunError

DEFAULT_DIST_TIMEOUT = 600.0
"""Seconds to wait for the process group when this rank's config did not load (its own
``runner.dist_timeout`` unknown): long enough for the other ranks to join and hear why."""


def load_everywhere(
    config: Path, overrides: Sequence[str], work_dir: Path | None, files: Mapping[str, str]
) -> LoadedConfig:
    """Load the config and check that the named ``files`` (option to path) exist.

    In a multi-process launch every rank then joins the process group (bounded by the
    config's ``runner.dist_timeout``) and the ranks compare what they found: a mistake on
    any rank (a path missing on one node) ends every rank with its own ``[rank N]`` line,
    instead of leaving the others waiting for the group.
    """
    from hookrun.checkpoint.storage import location
    from hookrun.config import file as cfg
    from hookrun.distributed.cluster import env_world_size

    error: HookrunError | None = None
    loaded = None
    try:
        loaded = cfg.load(config, overrides, work_dir)
        for option, path in files.items():
            if not location(path).exists():  # a file, a sharded folder, or a URL's object
                raise HookrunError(f"{option}: file not found: {path}")
    except HookrunError as exc:
        if env_world_size() == 1:
            raise
        error = exc
    if env_world_size() > 1:
        from hookrun.distributed import process_group

        timeout = loaded.runner["dist_timeout"] if loaded is not None else DEFAULT_DIST_TIMEOUT
        process_group.init_from_env(timeout)
        with process_group.errors_agreed():
            if error is not None:
                raise error
    assert loaded is not None
    return loaded


def check_fresh_work_dir(loaded: LoadedConfig) -> None:
    """Refuse a work dir that holds a run (:func:`hookrun.checkpoint.resume.check_unused`, the rule
    ``Runner.train`` applies too), or a file the run would write over that hookrun did not
    write (:func:`hookrun.engine.workdir.refuse_foreign`), before the task is built: the
    plugins the config selects are made from their settings alone to ask where the run's
    checkpoints go (:func:`hookrun.engine.workdir.checkpoint_dirs`)."""
    from hookrun.checkpoint.resume import check_unused
    from hookrun.engine.workdir import CONFIG_NAME, checkpoint_dirs, refuse_foreign, run_files
    from hookrun.hooks.manager import PluginManager

    plugins = PluginManager(loaded.data["plugins"]).plugins.values()
    check_unused(loaded.work_dir, checkpoint_dirs(loaded.work_dir, plugins))
    refuse_foreign(loaded.work_dir, run_files(loaded.work_dir, [CONFIG_NAME]))


def build_runner(
    loaded: LoadedConfig,
    training: bool = True,
    runner_arguments: Mapping[str, Any] | None = None,
) -> Any:
    """Seed, build the task's objects (:func:`hookrun.cli.build.build_task`), construct the Runner
    (which joins the launch's process group unless :func:`load_everywhere` did) with the
    config's runner arguments, ``runner_arguments`` replacing some (``--smoke``)."""
    from hookrun.cli.build import build_task
    from hookrun.distributed.process_group import errors_agreed
    from hookrun.engine.runner import Runner

    with errors_agreed():  # a task that fails on one rank ends every rank
        objects = build_task(loaded, training)
    hooks = objects.pop("hooks", None) or ()
    return Runner(
        **objects,
        **{**loaded.runner, **(runner_arguments or {})},
        plugins=loaded.data["plugins"],
        hooks=hooks,
        config=loaded.resolved(),
    )


def save_resolved_config(loaded: LoadedConfig) -> None:
    """``<work_dir>/config.yaml``: the config as run, paths absolute (rank 0 only)."""
    from hookrun.checkpoint.files import atomic_write_text
    from hookrun.engine.workdir import CONFIG_NAME

    out = loaded.work_dir
    out.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(loaded.resolved(), sort_keys=False)
    atomic_write_text("# resolved by `hookrun train`\n" + text, out / CONFIG_NAME)

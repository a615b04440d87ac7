"""The ``hookrun`` command line: train, evaluate, inspect plugins, hooks and configs.

Exit codes: 0 success, 1 training failed (the traceback is shown; one line for a runtime
checkpoint failure such as a full disk), 2 a usage or config error, a checkpoint that cannot
be loaded or does not fit included (one line per problem on stderr, no traceback), 128 + N
after a stop by signal N (130 Ctrl-C, 143 SIGTERM, 141 a closed standard output). Only
click and the standard library are imported at start-up; ``plugins list`` stays on
entry-point metadata (no torch, pydantic, pluggy or plugin import). Under torchrun or SLURM
rank 0 prints the run's output; every rank prints its own errors, prefixed ``[rank N]``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hookrun.cli.console import (
    aligned,
    echo,
    print_call_order,
    print_hook_table,
    print_summary,
    rank,
    to_json,
)
from hookrun.distributed.cluster import rank_prefix
from hookrun.errors import CheckpointError, HookrunError

if TYPE_CHECKING:
    from hookrun.checkpoint.storage import URL

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_SIGINT, EXIT_CLOSED_PIPE = 130, 141  # 128 + the signal's number


# -- the command group ---------------------------------------------------------------------


EPILOG = """\b
Example:
  hookrun config validate examples/digits/config.yaml
  hookrun schedule examples/digits/config.yaml
  hookrun train examples/digits/config.yaml --work-dir runs/digits
  hookrun train examples/digits/config.yaml --work-dir runs/digits --resume auto

\b
Exit codes: 0 success, 1 training failed, 2 a mistake in what was given; 128 + N stopped
  by signal N after saving at an iteration boundary: 130 Ctrl-C (SIGINT), 143 SIGTERM,
  141 a closed pipe (| head).
Docs: https://github.com/hookrun/hookrun/tree/main/docs (cli.md, config.md)
"""


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.version_option(package_name="hookrun", prog_name="hookrun")
def cli() -> None:
    """hookrun: train PyTorch models from a YAML config with installable plugins."""


class _Group(click.Group):
    """Lists each command with its whole first paragraph, not click's 45-character cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, " ".join((cmd.help or "").strip().split("\n\n")[0].split()))
            for name in self.list_commands(ctx)
            if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


cli.__class__ = _Group


def _path_name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A path argument or option whose name no file system takes (a name over 255 bytes, a
    NUL byte) is one line, exit 2, before anything is read or created."""
    from hookrun.config.arguments import path_problem

    problem = None if value is None or value == "auto" else path_problem(str(value))
    if problem:
        name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
        raise HookrunError(f"{name}: {problem} (got {str(value)!r})")
    return value


config_argument = click.argument(
    "config", type=click.Path(dir_okay=False, path_type=Path), callback=_path_name
)
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value (dotted key, YAML value); repeatable: --set runner.seed=1",
)
work_dir_option = click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run folder (overrides runner.work_dir); relative to the current directory.",
)


@cli.command()
@config_argument
@set_option
@click.option(
    "--resume",
    metavar="auto|PATH",
    callback=_path_name,
    help="Continue a run: 'auto' takes the newest loadable checkpoint of the work dir "
    "(fresh start when there is none), or give a checkpoint file.",
)
@work_dir_option
@click.option("-v", "--verbose", is_flag=True, help="Print which plugin serves which hook point.")
@click.option(
    "--smoke",
    is_flag=True,
    help="Check the config's whole path in seconds: one epoch of 2 batches, 2 batches of each "
    "validation and test set, the config's plugins, in a temporary work dir removed afterwards.",
)
def train(
    config: Path,
    overrides: Sequence[str],
    resume: str | None,
    work_dir: Path | None,
    verbose: bool,
    smoke: bool,
) -> None:
    """Train the task of CONFIG, then test it when the task has a test_dataloader.

    One run at a time per work dir: a work dir another run is using is refused, naming its
    pid. Refuses a work dir that already holds a run unless --resume is given, so no run is
    ever overwritten; one whose run never completed an iteration is started over. With
    --resume auto, a run that is already finished is left as it is.
    """
    if not smoke:
        _train(config, overrides, resume, work_dir, verbose)
        return
    from hookrun.cli import smoke as smoke_run

    for option, value in (("--resume", resume), ("--work-dir", work_dir)):
        if value is not None:
            raise HookrunError(
                f"--smoke: a smoke run starts afresh in a temporary work dir; leave out {option}"
            )
    with smoke_run.temporary_work_dir(rank() == 0) as folder:
        _train(config, overrides, None, folder, verbose, smoke_run.RUNNER)
    _notice(f"smoke run passed; its work dir {folder} is removed")


def _train(
    config: Path,
    overrides: Sequence[str],
    resume: str | None,
    work_dir: Path | None,
    verbose: bool,
    runner_arguments: Mapping[str, Any] | None = None,
) -> None:
    """``hookrun train`` (:func:`train`) into ``work_dir`` (None: the config's), with
    ``runner_arguments`` replacing the config's (``--smoke``)."""
    from hookrun.cli import prepare as launch
    from hookrun.engine import workdir

    named = {"--resume": resume} if resume not in (None, "auto") else {}
    loaded = launch.load_everywhere(config, overrides, work_dir, named)
    out = loaded.work_dir
    # rank 0 holds the work dir from here to the end, Runner.train re-enters the lock
    with workdir.hold(out, enabled=rank() == 0, notice=_notice):
        if resume is None:  # refused before the task is built
            launch.check_fresh_work_dir(loaded)
        # torch is imported only now: a config mistake is reported without waiting for it
        from hookrun.checkpoint import state as run_state
        from hookrun.distributed import collectives, process_group

        _notice(f"building task {loaded.data['task']} ...")  # importing torch takes seconds
        runner = launch.build_runner(loaded, runner_arguments=runner_arguments)
        finished = run_state.finished_position(runner) if resume == "auto" else None
        if finished is not None:
            last = runner.max_iters
            beyond = (
                ""
                if last is None
                else f" of {last}"
                if finished.iter <= last
                else f" past the {last} asked for"
            )
            where = f"iteration {finished.iter}{beyond}"
            echo(f"run in {out} is already finished ({where}); nothing to do")
            return
        with (
            process_group.errors_agreed()
        ):  # every check that can refuse, before anything is written
            run_state.check_start(runner, resume)
        collectives.barrier()  # every rank checked the work dir before rank 0 writes into it
        if runner.is_main:
            workdir.clear_finished(out)
            launch.save_resolved_config(loaded)
        if verbose:
            print_hook_table(runner)
        _notice(model_summary(runner.unwrapped_model))  # every check passed: the run starts
        runner.train(resume=resume)
        test = runner.test() if runner.test_dataloader is not None else None
        print_summary(runner, loaded, runner.last_metrics.get("val"), test)
        if runner.is_main:
            run_state.mark_finished(runner)  # what `--resume auto` checks


def _notice(message: str) -> None:
    echo(f"[hookrun] {message}")


def model_summary(model: Any) -> str:
    """``model Net: 1,234 parameters (1,000 trainable), 0.01 MiB``: what the run trains,
    its parameters counted once each (shared ones too) and its size with the buffers."""
    params = list(model.parameters())
    count = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    size = sum(t.numel() * t.element_size() for t in [*params, *model.buffers()])
    return (
        f"model {type(model).__name__}: {count:,} parameters ({trainable:,} trainable), "
        f"{size / 2**20:.2f} MiB"
    )


checkpoint_option = click.option(
    "--checkpoint",
    metavar="PATH",
    callback=_path_name,
    help="Checkpoint file to evaluate (default: the run's latest checkpoint in the work dir).",
)


@cli.command(name="val")
@config_argument
@checkpoint_option
@set_option
@work_dir_option
def val_command(
    config: Path, checkpoint: str | None, overrides: Sequence[str], work_dir: Path | None
) -> None:
    """Evaluate a checkpoint (default: the run's latest) on the task's val_dataloader."""
    _evaluate(config, checkpoint, overrides, work_dir, "val")


@cli.command(name="test")
@config_argument
@checkpoint_option
@set_option
@work_dir_option
def test_command(
    config: Path, checkpoint: str | None, overrides: Sequence[str], work_dir: Path | None
) -> None:
    """Evaluate a checkpoint (default: the run's latest) on the task's test_dataloader."""
    _evaluate(config, checkpoint, overrides, work_dir, "test")


@cli.command(name="export")
@click.argument("checkpoint", type=click.Path(path_type=Path), callback=_path_name)
@click.argument("out", type=click.Path(path_type=Path), callback=_path_name)
@click.option("--ema", is_flag=True, help="Export the EMA plugin's averaged weights instead.")
def export_command(checkpoint: Path, out: Path, ema: bool) -> None:
    """Write the model weights of CHECKPOINT (a file, or a sharded checkpoint folder) to OUT:
    one plain state dict that torch.load(OUT, weights_only=True) loads into the model."""
    from hookrun.checkpoint.export import export

    count = export(checkpoint, out, ema)
    echo(f"[hookrun] wrote {out}: {count} entries of the {'EMA' if ema else 'model'} weights")


@cli.command(name="predict")
@config_argument
@click.option(
    "--checkpoint",
    "checkpoint",
    required=True,
    type=click.Path(path_type=Path),
    callback=_path_name,
    help="Checkpoint file (or sharded folder) whose weights predict.",
)
@click.option(
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    callback=_path_name,
    help="File to write the outputs to; its folder must exist.",
)
@click.option("--ema", is_flag=True, help="Predict with the EMA plugin's averaged weights.")
@click.option("--force", is_flag=True, help="Replace --output when it exists.")
@set_option
def predict_command(
    config: Path, checkpoint: Path, output: Path, ema: bool, force: bool, overrides: Sequence[str]
) -> None:
    """Write the outputs of CHECKPOINT's model over the task's predict_dataloader (else its
    test_dataloader) to one file that torch.load(FILE, weights_only=True) loads: tensors
    concatenated along dim 0 in the loader's order (docs/predict.md).

    Nothing is evaluated or logged and the work dir is left alone. An existing --output is
    refused unless --force is given.
    """
    from hookrun.cli import predict

    outputs = predict.run(config, checkpoint, output, ema, force, overrides, _notice)
    _notice(f"wrote {output}: {predict.describe(outputs)}")


def _check_place(where: str, path: str | Path, folder: bool) -> None:
    """Refuse an output path hookrun cannot create or write (a file where a folder goes, a
    folder where the file goes), before any work: :func:`hookrun.config.file.place_errors`."""
    from hookrun.config.file import place_errors

    errors = place_errors(where, path, folder)
    if errors:
        raise HookrunError(errors)


def _evaluate(
    config: Path, checkpoint: str | None, overrides: Sequence[str], work_dir: Path | None, mode: str
) -> None:
    from hookrun.cli.prepare import build_runner, load_everywhere
    from hookrun.engine import workdir

    named = {"--checkpoint": checkpoint} if checkpoint is not None else {}
    loaded = load_everywhere(config, overrides, work_dir, named)
    out = loaded.work_dir
    # the work dir's lock, as train takes it: evaluation appends to the run's logs
    hint = "evaluate into another --work-dir"
    with workdir.hold(out, enabled=rank() == 0, hint=hint, notice=_notice):
        _notice(f"building task {loaded.data['task']} ...")
        runner = build_runner(loaded, training=False)
        if getattr(runner, f"{mode}_dataloader") is None:
            raise HookrunError(f"task: {loaded.data['task']} returned no {mode}_dataloader")
        path = Path(checkpoint) if checkpoint is not None else _latest(runner)
        # resume=True restores plugin state too (an EMA evaluates with its averaged weights);
        # a file that does not fit is refused before the writers open
        runner.load_checkpoint(path, resume=True)
        _notice(f"evaluating {path}")
        metrics = runner.val() if mode == "val" else runner.test()
    val, test = (metrics, None) if mode == "val" else (None, metrics)
    print_summary(runner, loaded, val, test)


def _latest(runner: Any) -> Path | URL:
    """The checkpoint ``--resume auto`` would take first: the ``latest`` pointer's file, else
    the newest in the run's checkpoint folder."""
    from hookrun.checkpoint import files as ckpt_io

    folder = runner.checkpoint_dir
    found = ckpt_io.candidates(folder)
    if not found:
        raise HookrunError(
            f"--checkpoint: none given and {folder} holds no checkpoint; give --checkpoint PATH"
        )
    return found[0]


# -- plugins -------------------------------------------------------------------------------


@cli.group(cls=_Group)
def plugins() -> None:
    """Installed plugins (entry points of the hookrun.plugins group)."""


@plugins.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per plugin.")
@click.option(
    "--load",
    is_flag=True,
    help="Import each plugin: add priority, default state, hook points and load errors.",
)
def plugins_list(as_json: bool, load: bool) -> None:
    """List installed plugins; fast, from package metadata only unless --load is given."""
    from hookrun.hooks.discovery import (
        PLUGIN_GROUP,
        blocked_plugins,
        clash_message,
        clashes,
        install_from_clone,
        installed_plugins,
    )

    found = installed_plugins()
    blocked = blocked_plugins()
    for name, infos in clashes(PLUGIN_GROUP).items():
        echo(f"warning: {clash_message('plugin', name, infos)}", err=True)
    rows: list[dict[str, Any]] = [info.as_row() for info in found.values()]
    if load:
        from hookrun.hooks.inspection import describe_plugin

        for row in rows:
            row.update(describe_plugin(row["name"], found, blocked))
    if as_json:
        echo(to_json(rows))
        return
    if not rows:
        echo(f"no plugins installed; hookrun's own, e.g. {install_from_clone('plugins', 'logger')}")
        return
    header = ["name", "distribution", "version", "entry point"]
    grid = [[r["name"], r["distribution"], r["version"], r["entry_point"]] for r in rows]
    if load:
        header += ["priority", "default", "hooks", "status"]
        for line, r in zip(grid, rows, strict=True):
            line += [
                "" if r["priority"] is None else str(r["priority"]),
                {True: "on", False: "off", None: ""}[r["enabled_by_default"]],
                str(len(r["hooks"])),
                r["status"],
            ]
    else:
        for line, r in zip(grid, rows, strict=True):
            if r["name"] in blocked:
                line[0] += " (blocked)"
    echo(aligned(grid, header))
    if load:
        print_call_order(rows)


@plugins.command(name="show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def plugins_show(name: str, as_json: bool) -> None:
    """Describe one plugin: settings with type, default, constraints and description."""
    from hookrun.hooks.discovery import blocked_plugins, installed_plugins, unknown_plugin_message

    found = installed_plugins()
    if name not in found:
        raise HookrunError(unknown_plugin_message(name, "plugins show", found))
    if name in blocked_plugins():
        raise HookrunError(
            f"plugins show: plugin {name!r} is blocked by HOOKRUN_DISABLE_PLUGINS (never "
            "imported); unset it to inspect the plugin"
        )
    from hookrun.config.schema import settings_rows
    from hookrun.hooks.inspection import describe_plugin

    info = describe_plugin(name, found, set())
    if info["error"]:
        raise HookrunError(f"plugins show {name}: {info['error']}")

    cls = found[name].entry_point.load()
    doc = " ".join((cls.__doc__ or "").split())
    result = {
        **found[name].as_row(),
        "description": doc,
        "priority": info["priority"],
        "enabled_by_default": info["enabled_by_default"],
        "hooks": info["hooks"],
        "settings": settings_rows(cls.Settings),
    }
    if as_json:
        echo(to_json(result))
        return
    echo(f"{name}  ({result['distribution']} {result['version']}, {result['entry_point']})")
    if doc:
        echo(doc)
    state = "on" if result["enabled_by_default"] else "off"
    echo(f"priority {result['priority']}; enabled by default: {state}")
    echo(f"hook points: {', '.join(result['hooks'])}")
    echo()
    rows = [
        [r["name"], r["type"], r["default"], r["constraints"], r["description"]]
        for r in result["settings"]
    ]
    if rows:
        from rich.console import Console
        from rich.table import Table

        table = Table("setting", "type", "default", "constraints", "description", show_lines=True)
        for row in rows:
            table.add_row(*row)
        Console(highlight=False).print(table)
    else:
        echo("no settings")


@plugins.command(name="new")
@click.argument("name")
@click.option(
    "--dir", "directory", default=".", type=click.Path(file_okay=False), help="Parent folder."
)
def plugins_new(name: str, directory: str) -> None:
    """Write a ready-to-install plugin package hookrun-NAME (pyproject, module, test)."""
    from hookrun.cli.scaffold import new_plugin

    _check_place("--dir", directory, folder=True)
    root = new_plugin(name, directory)
    echo(f"wrote {root}; next: pip install -e {root} && hookrun plugins show {name}")


# -- hooks and config ----------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Name, arguments and docs as JSON.")
def hooks(as_json: bool) -> None:
    """Every hook point with its arguments and documentation."""
    from hookrun.hooks.inspection import hook_entries

    entries = hook_entries()
    if as_json:
        echo(to_json(entries))
        return
    for entry in entries:
        echo(click.style(f"{entry['name']}({', '.join(entry['arguments'])})", bold=True))
        for line in entry["doc"].splitlines():
            echo(f"    {line}".rstrip())
        echo()


@cli.group(name="config", cls=_Group)
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


@cli.command()
@config_argument
@set_option
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PNG",
    callback=_path_name,
    help="Also draw the schedule into this PNG file (needs the plot extra: matplotlib).",
)
@click.option("--json", "as_json", is_flag=True, help="Every iteration as JSON.")
def schedule(config: Path, overrides: Sequence[str], plot: Path | None, as_json: bool) -> None:
    """The learning rate (and momentum) over the whole run of CONFIG, without training."""
    from hookrun.config import file as cfg
    from hookrun.config import schedule as lr_schedule

    loaded = cfg.load(config, overrides)
    if plot is not None:
        _check_place("--plot", plot, folder=False)
        lr_schedule.check_plot_extra()
    if not as_json:  # machine-readable output holds nothing else
        _notice(f"building task {loaded.data['task']} ...")
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


# -- entry point ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI and turn errors into exit codes: 2 for usage/config, 1 for failures, 141
    (SIGPIPE's) when the reader of the output went away; stop, interrupt and error lines go
    to stderr."""
    from hookrun.engine.stop_signals import StdoutGuard

    stdout = sys.stdout
    guard = StdoutGuard(stdout)
    sys.stdout = guard
    try:
        code = _main(argv)
    finally:
        sys.stdout = stdout
    sys.exit(EXIT_CLOSED_PIPE if guard.closed_pipe and code == EXIT_OK else code)


def _main(argv: Sequence[str] | None) -> int:
    """The command's exit code."""
    try:
        cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="hookrun",
            standalone_mode=False,
        )
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        if rank() == 0:
            exc.show()
        return EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt):
        echo("interrupted", err=True)
        return EXIT_SIGINT
    except HookrunError as exc:  # every rank prints its own, prefixed [rank N]
        for line in exc.lines:
            click.echo(rank_prefix() + line, err=True)
        return EXIT_USAGE
    except CheckpointError as exc:  # a runtime failure (full disk, I/O), not a bug: one line
        print(f"{rank_prefix()}error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # written past the guard (another stream on the same pipe)
        return EXIT_CLOSED_PIPE
    except Exception as exc:
        _print_failure(exc)
        return EXIT_FAILED
    return EXIT_OK


def _print_failure(exc: BaseException) -> None:
    """The traceback without the CLI's own frames: it starts where hookrun or the user's
    code raised. Every rank prints its own (they may differ)."""
    import traceback

    tb = exc.__traceback__
    skipped = (str(Path(click.__file__).parent), __file__)
    while (
        tb is not None
        and tb.tb_next is not None
        and tb.tb_frame.f_code.co_filename.startswith(skipped)
    ):
        tb = tb.tb_next
    print(f"{rank_prefix()}hookrun: training failed:", file=sys.stderr)
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)

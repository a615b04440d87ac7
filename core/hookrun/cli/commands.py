"""The ``hookrun`` command line: its group, train, evaluate, export and predict, and ``main``
(``plugins`` and ``hooks`` are in :mod:`.plugin_commands`, ``config`` and ``schedule`` in
:mod:`.config_commands`).

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

from hookrun.cli.config_commands import config_group, schedule
from hookrun.cli.console import (
    echo,
    print_hook_table,
    print_summary,
    rank,
)
from hookrun.cli.options import (
    CommandGroup,
    PathType,
    checkpoint_option,
    config_argument,
    notice,
    path_name,
    set_option,
    usage_line,
    work_dir_option,
)
from hookrun.cli.plugin_commands import hooks, plugins
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
    cls=CommandGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=EPILOG,
)
@click.version_option(package_name="hookrun", prog_name="hookrun")
def cli() -> None:
    """hookrun: train PyTorch models from a YAML config with installable plugins."""


for command in (plugins, hooks, config_group, schedule):  # each in its own module
    cli.add_command(command)


@cli.command()
@config_argument
@set_option
@click.option(
    "--resume",
    metavar="auto|PATH",
    callback=path_name,
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
    notice(f"smoke run passed; its work dir {folder} is removed")


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
    from hookrun.engine import workdir, workdir_hold

    named = {"--resume": resume} if resume not in (None, "auto") else {}
    loaded = launch.load_everywhere(config, overrides, work_dir, named)
    out = loaded.work_dir
    # rank 0 holds the work dir from here to the end, Runner.train re-enters the lock; a
    # failure before the run writes there removes the folder if the lock created it
    with workdir_hold.hold(out, enabled=rank() == 0, notice=notice):
        if resume is None:  # refused before the task is built
            launch.check_fresh_work_dir(loaded)
        # torch is imported only now: a config mistake is reported without waiting for it
        from hookrun.checkpoint import resume as run_resume
        from hookrun.distributed import collectives, process_group

        notice(f"building task {loaded.data['task']} ...")  # importing torch takes seconds
        runner = launch.build_runner(loaded, runner_arguments=runner_arguments)
        finished = run_resume.finished_position(runner) if resume == "auto" else None
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
            run_resume.check_start(runner, resume, writes=[workdir.CONFIG_NAME])
        collectives.barrier()  # every rank checked the work dir before rank 0 writes into it
        if runner.is_main:
            workdir.clear_finished(out)
            launch.save_resolved_config(loaded)
        if verbose:
            print_hook_table(runner)
        notice(model_summary(runner.unwrapped_model))  # every check passed: the run starts
        runner.train(resume=resume)
        test = runner.test() if runner.test_dataloader is not None else None
        print_summary(runner, loaded, runner.last_metrics.get("val"), test)
        if runner.is_main:
            run_resume.mark_finished(runner)  # what `--resume auto` checks


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
@click.argument("checkpoint", type=PathType(path_type=Path), callback=path_name)
@click.argument("out", type=PathType(path_type=Path), callback=path_name)
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
    type=PathType(path_type=Path),
    callback=path_name,
    help="Checkpoint file (or sharded folder) whose weights predict.",
)
@click.option(
    "--output",
    required=True,
    type=PathType(dir_okay=False, path_type=Path),
    callback=path_name,
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

    outputs = predict.run(config, checkpoint, output, ema, force, overrides, notice)
    notice(f"wrote {output}: {predict.describe(outputs)}")


def _evaluate(
    config: Path, checkpoint: str | None, overrides: Sequence[str], work_dir: Path | None, mode: str
) -> None:
    from hookrun.cli.prepare import build_runner, load_everywhere
    from hookrun.engine import workdir_hold

    named = {"--checkpoint": checkpoint} if checkpoint is not None else {}
    loaded = load_everywhere(config, overrides, work_dir, named)
    out = loaded.work_dir
    # the work dir's lock, as train takes it: evaluation appends to the run's logs
    hint = "evaluate into another --work-dir"
    with workdir_hold.hold(out, enabled=rank() == 0, hint=hint, notice=notice):
        notice(f"building task {loaded.data['task']} ...")
        runner = build_runner(loaded, training=False)
        if getattr(runner, f"{mode}_dataloader") is None:
            raise HookrunError(f"task: {loaded.data['task']} returned no {mode}_dataloader")
        path = Path(checkpoint) if checkpoint is not None else _latest(runner)
        # resume=True restores plugin state too (an EMA evaluates with its averaged weights);
        # a file that does not fit is refused before the writers open
        runner.load_checkpoint(path, resume=True)
        notice(f"evaluating {path}")
        metrics = runner.val() if mode == "val" else runner.test()
    val, test = (metrics, None) if mode == "val" else (None, metrics)
    print_summary(runner, loaded, val, test)


def _latest(runner: Any) -> Path | URL:
    """The checkpoint ``--resume auto`` would take first: the ``latest`` pointer's file, else
    the newest in the run's checkpoint folder."""
    from hookrun.checkpoint import folder as checkpoint_folder

    folder = runner.checkpoint_dir
    found = checkpoint_folder.candidates(folder)
    if not found:
        raise HookrunError(
            f"--checkpoint: none given and {folder} holds no checkpoint; give --checkpoint PATH"
        )
    return found[0]


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
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                exc.show()  # `hookrun plugins` alone: the group's help, as before
            else:
                click.echo(usage_line(exc), err=True)
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

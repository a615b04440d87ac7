"""``hookrun predict CONFIG --checkpoint PATH --output FILE``: the outputs of a checkpoint's
model (or its EMA average) over the task's ``predict_dataloader``, else its ``test_dataloader``,
written as one file that ``torch.load(FILE, weights_only=True)`` loads.

Every mistake in what was given is one line before the task is built or anything is
written: an output whose folder does not exist, an output file that exists (replaced only
with ``--force``), a missing checkpoint, a task with neither loader, a checkpoint that does
not fit, outputs ``weights_only`` loading would refuse. Under torchrun every rank predicts
its share and rank 0 writes the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hookrun.errors import HookrunError


def check_output(output: Path, checkpoint: Path, force: bool) -> None:
    """Refuse an output hookrun should not write: one in a folder that does not exist, one
    that exists (unless ``force``), the checkpoint itself, one it cannot write."""
    from hookrun.config.file import place_errors

    if not output.parent.is_dir():
        raise HookrunError(f"--output: folder {output.parent} does not exist; create it first")
    if output.exists() and output.resolve() == checkpoint.resolve():
        raise HookrunError(f"--output: {output} is the checkpoint itself; name another file")
    if output.is_file() and not force:
        raise HookrunError(f"--output: {output} exists; pass --force to replace it")
    errors = place_errors("--output", output, folder=False)
    if errors:
        raise HookrunError(errors)


def run(
    config: Path,
    checkpoint: Path,
    output: Path,
    ema: bool,
    force: bool,
    overrides: Sequence[str],
    notice: Any,
) -> Any:
    """Build the task, load the weights, predict, write ``output`` (rank 0); the outputs."""
    from hookrun.checkpoint import files as ckpt_io
    from hookrun.cli.prepare import build_runner, load_everywhere
    from hookrun.distributed import collectives, process_group

    loaded = load_everywhere(config, overrides, None, {"--checkpoint": str(checkpoint)})
    with process_group.errors_agreed():
        if collectives.get_rank() == 0:
            check_output(output, checkpoint, force)
    notice(f"building task {loaded.data['task']} ...")
    runner = build_runner(loaded, training=False)
    loader = runner.predict_dataloader
    if loader is None:
        loader = runner.test_dataloader
    if loader is None:
        raise HookrunError(
            f"task: {loaded.data['task']} returned no predict_dataloader and no test_dataloader"
        )
    with process_group.errors_agreed():
        load_weights(runner, checkpoint, ema)
    notice(f"predicting with {'the EMA weights of ' if ema else ''}{checkpoint}")
    outputs = runner.predict(loader)
    with process_group.errors_agreed():
        problem = ckpt_io.unsafe_value(outputs, "outputs")
        if problem:
            raise HookrunError(
                f"--output: {problem} (return them from the model's predict_step); nothing written"
            )
        if runner.is_main:
            ckpt_io.atomic_save(outputs, output)
    return outputs


def load_weights(runner: Any, checkpoint: Path, ema: bool) -> None:
    """The checkpoint's model weights, checked against the model; with ``ema`` then the EMA
    plugin's average from the same checkpoint, as ``hookrun export --ema`` finds it."""
    from hookrun.checkpoint import state as run_state
    from hookrun.checkpoint.export import weights

    runner.load_checkpoint(checkpoint, resume=False)  # a file that does not fit: one line
    if ema:
        run_state.restore(runner, {"model": weights(checkpoint, ema=True)}, resume=False)


def describe(outputs: Any) -> str:
    """What was written, in a few words: the shape of a tensor, the fields of a dict."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return f"a tensor of shape {list(outputs.shape)}"
    if isinstance(outputs, dict):
        return f"a dict of {', '.join(map(str, outputs))}"
    return f"a {type(outputs).__name__} of {len(outputs)}"

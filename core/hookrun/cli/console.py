"""What the ``hookrun`` commands print: rank-0 output, aligned tables, the hook table, the
final summary of a run. Only click and the standard library at import (``plugins list``
must start fast); rich is imported where a summary is printed."""

from __future__ import annotations

from typing import Any

import click

from hookrun.cli.numbers import format_number
from hookrun.distributed.cluster import env_rank


def rank() -> int:
    """This process's rank by the launcher's environment (torchrun or SLURM)."""
    return env_rank()


def echo(message: str = "", err: bool = False) -> None:
    """Print on rank 0 only."""
    if rank() == 0:
        click.echo(message, err=err)


def aligned(rows: list[list[str]], header: list[str]) -> str:
    """Plain aligned columns (rich would cost start-up time in ``plugins list``)."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_hook_table(runner: Any) -> None:
    rows = [[hook, ", ".join(names)] for hook, names in runner.manager.table() if names]
    echo(aligned(rows, ["hook point", "plugins in call order"]))


def print_summary(
    runner: Any, loaded: Any, val: dict[str, float] | None, test: dict[str, float] | None
) -> None:
    if not runner.is_main:
        return
    from rich.table import Table

    table = Table(title="final metrics")
    table.add_column("metric")
    columns = [(name, m) for name, m in (("val", val), ("test", test)) if m]
    for name, _ in columns:
        table.add_column(name, justify="right")
    for key in dict.fromkeys(k for _, m in columns for k in m):
        table.add_row(key, *(format_number(m[key]) if key in m else "" for _, m in columns))
    console = runner.console
    if columns:
        console.print(table)
    work_dir = runner.work_dir
    lines = [("run folder", str(work_dir))]
    ran = writer_names(loaded.runner["writers"])
    if "jsonl" in ran:
        lines.append(("JSONL log", str(work_dir / "log.jsonl")))
    folder = runner.checkpoint_dir  # a Path, or the URL of an object store
    saved = sorted(p.name for p in folder.iterdir() if p.suffix == ".pt") if folder.is_dir() else []
    if saved:
        lines.append(("checkpoints", f"{runner.checkpoint_dir} ({', '.join(saved)})"))
    if "tensorboard" in ran:
        lines.append(("TensorBoard", f"tensorboard --logdir {work_dir / 'tensorboard'}"))
    others = [name for name in ran if name not in ("jsonl", "tensorboard")]
    if others:
        lines.append(("writers", ", ".join(others)))
    for label, text in lines:
        console.print(f"{label + ':':<13} {text}", markup=False, soft_wrap=True)


def writer_names(spec: Any) -> list[str]:
    """The writers a validated ``runner.writers`` spec turns on."""
    if isinstance(spec, dict):
        return [str(name) for name, options in spec.items() if options is not False]
    return [str(name) for name in spec or ()]


def to_json(data: Any) -> str:
    import json  # imported on use: start-up time matters for `plugins list`

    return json.dumps(data, indent=2)


def print_call_order(rows: list[dict[str, Any]]) -> None:
    """Each hook point with the plugins serving it in call order, then any load errors."""
    from hookrun.hooks.inspection import call_order

    grid = [[hook, ", ".join(names)] for hook, names in call_order(rows)]
    echo()
    echo(aligned(grid, ["hook point", "plugins in call order (priority)"]))
    for r in rows:
        if r["error"]:
            echo(f"{r['name']} ({r['distribution']}): {r['error']}", err=True)

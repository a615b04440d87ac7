"""Writers during a run: opened from the resolved spec, their states saved and given back,
and finished with how the run ended."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookrun.writers.base import Writer


def open_writers(
    resolved: list[tuple[Any, dict[str, Any]]],
    work_dir: Path,
    states: Mapping[str, Mapping[str, Any]] | None = None,
    checkpoint_dir: Path | None = None,
) -> list[Writer]:
    """Instantiate resolved writers in ``work_dir`` (ready instances are used as they are),
    giving each the run's ``checkpoint_dir`` and the state its name holds in ``states``
    (what the same Runner's previous pass left, so a test pass continues the training's
    tracker run)."""
    writers: list[Writer] = []
    try:
        for cls, options in resolved:
            writers.append(cls if isinstance(cls, Writer) else cls(work_dir, **options))
    except BaseException:  # a writer refused (a planted link): the others are closed again
        for writer in writers:
            writer.close()
        raise
    if checkpoint_dir is not None:
        for writer in writers:
            writer.run_checkpoint_dir = checkpoint_dir
    restore_writer_states(writers, states or {})
    return writers


def writer_states(writers: list[Writer]) -> dict[str, dict[str, Any]]:
    """The states worth keeping (named writers with a non-empty ``state_dict``)."""
    states = {w.name: w.state_dict() for w in writers if w.name}
    return {name: state for name, state in states.items() if state}


def restore_writer_states(writers: list[Writer], states: Mapping[str, Any]) -> None:
    """Give each named writer its entry of ``states`` (a checkpoint's ``"writers"``)."""
    for writer in writers:
        state = states.get(writer.name) if writer.name else None
        if isinstance(state, Mapping):
            writer.load_state_dict(state)


def close_writers(writers: list[Writer], status: str) -> dict[str, dict[str, Any]]:
    """Finish every writer with the run's ``status``; returns their states, taken after
    (what finishing uploaded included), for a later pass of the same Runner. Every writer
    is finished even when one of them raises."""
    errors = []
    for writer in writers:
        try:
            writer.finish(status)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return writer_states(writers)

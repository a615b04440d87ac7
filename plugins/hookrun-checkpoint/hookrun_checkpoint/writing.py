"""Writing a save's files and deleting those it released: only files of the plugin's own
kinds, and in a work dir only files hookrun's record says hookrun created there
(:meth:`hookrun_checkpoint.storage.Storage.created`): a file of yours is never deleted or
written over because its name looks like a checkpoint's."""

from __future__ import annotations

import sys
from typing import Any

from hookrun import HookrunError
from hookrun_checkpoint.ledger import BEST, ROTATING, TOP, plain_name
from hookrun_checkpoint.storage import PARTIAL, TEMP, Storage, Writer


def refuse_overwrite(storage: Storage, names: list[str]) -> None:
    """Refuse a save whose file (or the ``latest`` pointer it moves) would replace a file
    hookrun did not write: one line naming it, before anything is written."""
    for name in [*names, "latest"]:
        if storage.exists(name) and not storage.created(name):
            raise HookrunError(
                f"checkpoint: will not write over {storage.path(name)}: hookrun did not write "
                "it (.hookrun.files does not list it); move it away and resume with "
                "`--resume auto`"
            )


def write_files(
    storage: Storage,
    write: Writer,
    state: dict[str, Any],
    names: list[str],
    delete: list[str],
    main: bool = True,
) -> None:
    """Write ``state`` to ``names``, then (only the ``main`` process, rank 0) point
    ``latest`` at the last and delete ``delete``. ``write`` is the runner's: the background
    thread holds it, not the runner. A file to delete that hookrun's record does not list
    stays, with a line on stderr."""
    for name in names:
        storage.write(write, state, name)
    if not main:
        return
    storage.write_text("latest", names[-1] + "\n")
    for name in delete:
        if not own_file(name) or not storage.inside(name):
            continue  # never reached: the record holds only such names
        if not storage.created(name):
            if storage.exists(name):
                _stderr(
                    f"keeping {storage.path(name)}: hookrun did not write it "
                    "(.hookrun.files does not list it)"
                )
            continue
        try:
            storage.remove(name)
        except OSError as exc:  # an old file left behind is no reason to stop training
            _stderr(f"cannot delete {storage.path(name)}: {exc}")


def _stderr(line: str) -> None:
    print(f"[hookrun] checkpoint: {line}", file=sys.stderr)


def leftover(name: str) -> bool:
    """Whether ``name`` is what a killed write of this plugin leaves behind: the core's
    temporary file (``.<name>.<12 hex digits>.tmp``) or a sharded save's ``.<name>.partial``
    folder, for a file name of the plugin's own kinds or the ``latest`` pointer."""
    found = TEMP.fullmatch(name) or PARTIAL.fullmatch(name)
    if found is None:
        return False
    target = found["name"]
    return target == "latest" or own_file(target)


def own_file(name: str) -> bool:
    """Whether ``name`` is a plain file name of one of the plugin's own kinds."""
    return any(plain_name(name, kind) for kind in (ROTATING, BEST, TOP))

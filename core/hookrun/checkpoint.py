"""Checkpoint files: format ``hookrun/1``, atomic writes, safe loads, RNG state.

Every value is something ``torch.load(path, weights_only=True)`` accepts, so loading never
needs (and never falls back to) unpickling arbitrary objects.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hookrun.errors import CheckpointError

FORMAT = "hookrun/1"


def atomic_save(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save`` so that ``path`` is either the old file or the new one.

    A temporary file in the same folder is written, flushed and fsynced, then renamed over
    ``path``, and the folder is fsynced so the rename itself survives a power cut.
    """
    return _atomic(path, lambda f: torch.save(obj, f))


def _atomic(path: str | Path, fill: Callable[[Any], object]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write(state: dict[str, Any], path: str | Path) -> Path:
    """Check that ``state`` will load with ``weights_only=True``, then write it atomically.

    Failures raise :class:`CheckpointError` naming the file; the previous file is intact.
    """
    path = Path(path)
    problem = unsafe_value(state)
    if problem:
        raise CheckpointError(f"cannot save {path}: {problem}")
    try:
        return atomic_save(state, path)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}") from exc


def atomic_write_text(text: str, path: str | Path) -> None:
    """Replace a small text file (a pointer such as ``latest``) atomically."""
    _atomic(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; anything else is refused."""
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint)
        raise ValueError(f"not a {FORMAT} checkpoint (format: {found!r})")
    return checkpoint


def candidates(folder: Path) -> list[Path]:
    """Checkpoint files in ``folder``, newest first.

    A ``latest`` text file naming a checkpoint in the folder puts that one first; the rest
    go by modification time, ties broken by the numbers in their names (iter_10 > iter_8).
    """
    if not folder.is_dir():
        return []
    files = [p for p in folder.glob("*.pt") if p.is_file()]
    files.sort(key=lambda p: (p.stat().st_mtime_ns, _natural(p.name)), reverse=True)
    pointer = folder / "latest"
    if pointer.is_file():
        named = folder / pointer.read_text(encoding="utf-8").strip()
        if named in files:
            files.remove(named)
            files.insert(0, named)
    return files


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def newest_loadable(
    folder: Path, report: Callable[[str], None], map_location: Any = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint in ``folder`` that loads; every one that does not is reported."""
    for path in candidates(folder):
        try:
            return path, load(path, map_location)
        except Exception as exc:  # truncated, corrupt or foreign file: skip it, say which
            report(f"skipping checkpoint {path}: cannot be loaded ({type(exc).__name__}: {exc})")
    return None


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) generator states as tensors and plain types."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    try:
        import numpy as np
    except ImportError:
        return state
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = {
        "kind": str(kind),
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if "numpy" in state:
        import numpy as np

        npst = state["numpy"]
        key = npst["key"].numpy().astype("uint32")
        np.random.set_state(
            (npst["kind"], key, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
        )


SAFE_SCALARS = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def unsafe_value(obj: Any, where: str = "checkpoint") -> str | None:
    """Where ``obj`` holds something ``weights_only=True`` loading would refuse, or None."""
    if isinstance(obj, torch.Tensor) or type(obj) in SAFE_SCALARS:  # exact: np.float64 is a float
        return None
    if type(obj) in (list, tuple):
        items: Any = enumerate(obj)
    elif type(obj) in (dict, OrderedDict):
        items = obj.items()
        for key in obj:
            if not isinstance(key, (str, int)):
                return f"{where} has a key of type {type(key).__name__}: {key!r}"
    else:
        return (
            f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which "
            "torch.load(weights_only=True) refuses; store tensors, numbers, strings, lists, dicts"
        )
    for key, value in items:
        problem = unsafe_value(value, f"{where}[{key!r}]")
        if problem:
            return problem
    return None

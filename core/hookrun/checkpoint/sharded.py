"""Sharded checkpoints (``strategy: fsdp``): a folder written by every rank.

The folder takes the name a checkpoint file would have (``iter_6.pt/``), so ``latest``,
``resume="auto"`` and the checkpoint plugin's name rules are the same for both kinds. It holds
the tensors of the model and optimizer as ``torch.distributed.checkpoint`` (DCP) shards, one
``__<rank>_0.distcp`` per rank plus DCP's ``.metadata``, and everything else (loop, RNG streams
of every rank, optimizer groups, scheduler, plugins) in ``state.pt``, an ordinary ``hookrun/1``
file without ``model``. Entries every rank holds alike (buffers such as BatchNorm statistics)
are rank 0's, as under DDP. A ``DTensor`` in a plugin's state (the EMA plugin's sharded
average) is written by DCP too, ``state.pt`` keeping a ``meta`` tensor of its global shape in
its place; :func:`plugin_states` reads it back sharded on dim 0 over this run's ranks (FSDP2's
layout), or whole in a run without FSDP.

Nothing is unpickled freely at load: ``state.pt`` loads with ``weights_only=True``; DCP's
``.metadata`` (a pickle) is read by an unpickler that knows only DCP's metadata classes, and a
checkpoint whose metadata declares a non-tensor entry (which DCP would load with
``weights_only=False``) is refused. A folder is written under ``.<name>.partial`` and renamed
once every rank has written its shard and ``.metadata`` and ``state.pt`` exist.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hookrun.checkpoint import files as ckpt_io
from hookrun.distributed import collectives
from hookrun.distributed.fsdp import is_dtensor
from hookrun.engine.optimizer_step import SINGLE
from hookrun.engine.workdir_hold import record_created
from hookrun.errors import CheckpointError, CheckpointMismatchError

if TYPE_CHECKING:
    from hookrun.checkpoint.checkpointable import Checkpointable

STATE_FILE = ckpt_io.SHARDED_STATE_FILE
METADATA_FILE = ".metadata"


def is_folder(path: Path) -> bool:
    """Whether ``path`` is a sharded checkpoint folder (complete or not)."""
    return path.is_dir()


def split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``state`` as (the tensors DCP writes, everything else for ``state.pt``): the model's
    tensors, and the optimizer state's tensors keyed by parameter name."""
    rest = {key: value for key, value in state.items() if key != "model"}
    tensors: dict[str, Any] = {"model": dict(state["model"])}
    plugins, moved_plugins = _split_dtensors(state.get("plugins", {}))
    if moved_plugins:
        rest["plugins"], tensors["plugins"] = plugins, moved_plugins
    optimizer = state.get("optimizers", {}).get(SINGLE)  # FSDP trains with one optimizer
    if optimizer is not None:
        kept: dict[str, Any] = {}
        moved: dict[str, Any] = {}
        for name, entry in optimizer["state"].items():
            moved[name] = {k: v for k, v in entry.items() if isinstance(v, torch.Tensor)}
            kept[name] = {k: v for k, v in entry.items() if not isinstance(v, torch.Tensor)}
        tensors["optimizer"] = moved
        rest["optimizers"] = {SINGLE: {**optimizer, "state": kept}}
    return tensors, rest


def _split_dtensors(value: Any) -> tuple[Any, Any]:
    """``value`` with each ``DTensor`` in its dicts replaced by a ``meta`` tensor of the same
    global shape and dtype, and the ``DTensor``s alone in the same nesting (None: none)."""

    def placeholder(leaf: Any) -> tuple[Any, Any] | None:
        if not is_dtensor(leaf):
            return None
        return torch.empty(leaf.shape, dtype=leaf.dtype, device="meta"), leaf

    return _replace_leaves(value, placeholder)


def _replace_leaves(
    value: Any, replace: Callable[[Any], tuple[Any, Any] | None]
) -> tuple[Any, Any]:
    """``value`` (nested dicts, a ``state_dict()``'s ``OrderedDict`` too) with every leaf
    that ``replace`` maps to ``(new, taken)`` replaced by ``new``, and the ``taken`` ones
    alone in the same nesting (None: none); ``replace`` returns None for a leaf it keeps."""
    replaced = replace(value)
    if replaced is not None:
        return replaced
    if not isinstance(value, dict):
        return value, None
    kept: dict[Any, Any] = {}
    taken: dict[Any, Any] = {}
    for key, item in value.items():
        kept[key], found = _replace_leaves(item, replace)
        if found is not None:
            taken[key] = found
    return kept, taken or None


def plugin_states(runner: Checkpointable, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The plugins' states of the folder ``checkpoint["sharded"]`` with every tensor DCP holds
    for them read in: under FSDP as ``DTensor``s sharded on dim 0 over every rank (as
    ``fully_shard`` lays out parameters, resharded when the world size changed), else whole
    (every rank calls this)."""
    mesh = next(
        (p.device_mesh for p in runner.unwrapped_model.parameters() if hasattr(p, "device_mesh")),
        None,
    )
    return _fill_plugins(checkpoint, checkpoint["sharded"], mesh, not collectives.is_distributed())


def _fill_plugins(checkpoint: dict[str, Any], path: Path, mesh: Any, alone: bool) -> dict[str, Any]:
    """``checkpoint["plugins"]`` with each ``meta`` placeholder replaced by the tensor DCP
    holds for it: sharded on dim 0 over ``mesh``, or whole without one (one ``dcp.load``)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor import empty as sharded_empty

    def template(placeholder: torch.Tensor) -> torch.Tensor:
        if mesh is None:
            return torch.empty(placeholder.shape, dtype=placeholder.dtype)
        return sharded_empty(
            placeholder.shape, dtype=placeholder.dtype, device_mesh=mesh, placements=[Shard(0)]
        )

    def filled(leaf: Any) -> tuple[Any, Any] | None:  # a meta placeholder: its template
        if not (isinstance(leaf, torch.Tensor) and leaf.is_meta):
            return None
        tensor = template(leaf)
        return tensor, tensor

    plugins, wanted = _replace_leaves(checkpoint.get("plugins", {}), filled)
    if wanted is not None:
        _read({"plugins": wanted}, path, alone=alone)  # into the templates, in place
    return plugins


def write(state: dict[str, Any], path: Path) -> Path:
    """Write ``state`` (a collected state with sharded tensors) to the folder ``path``; every
    rank calls this. A failure on any rank raises :class:`CheckpointError` on every rank and
    leaves whatever ``path`` held before."""
    tensors, rest = split(state)
    problem = ckpt_io.unsafe_value(rest)
    if problem:  # the same state on every rank: every rank raises
        raise CheckpointError(f"cannot save {path}: {problem}")
    partial = path.parent / f".{path.name}.partial"
    error: BaseException | None = None
    if collectives.get_rank() == 0:
        try:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        except OSError as exc:
            error = exc
    if not collectives.any_rank(error is not None):
        try:
            dcp.save(
                tensors,
                storage_writer=dcp.FileSystemWriter(partial, sync_files=True),
                planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True),  # rank 0's buffers
            )
        except Exception as exc:  # DCP gathers the ranks' failures on every rank
            error = exc
    if error is None and collectives.get_rank() == 0:
        try:
            ckpt_io.atomic_save(rest, partial / STATE_FILE)
            if not (partial / METADATA_FILE).is_file():
                raise CheckpointError(f"DCP wrote no {METADATA_FILE} in {partial}")
            _swap(partial, path)
        except (OSError, CheckpointError) as exc:
            error = exc
    if collectives.any_rank(error is not None):
        reason = getattr(error, "strerror", None) or error or "another rank failed"
        raise CheckpointError(f"cannot write checkpoint {path}: {reason}") from error
    return path


def _swap(partial: Path, path: Path) -> None:
    """Put the finished folder under its name: a file or folder already there is moved
    aside first and deleted after (a crash in between leaves ``.<name>.old``, loadable)."""
    old = path.parent / f".{path.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    existed = os.path.lexists(path)
    if path.is_dir():
        path.rename(old)
    elif path.exists():
        path.replace(old)
    partial.rename(path)
    ckpt_io.fsync_dir(path.parent)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)
    if not existed:
        record_created(path)  # the folder, as a file is: in the manifest of the work dir held


def load(path: Path) -> dict[str, Any]:
    """The ``state.pt`` of folder ``path`` (``hookrun/1``), with ``model`` holding the saved
    tensors' names and global shapes (as ``meta`` tensors, for the fit checks) and
    ``sharded`` the folder; the tensors themselves are read by :func:`restore_tensors`.

    A folder without ``.metadata`` or ``state.pt`` (a save that never finished) or whose
    metadata is not DCP's raises :class:`CheckpointMismatchError`.
    """
    for name in (METADATA_FILE, STATE_FILE):
        if not (path / name).is_file():
            reason = f"not a complete sharded checkpoint (no {name})"
            raise CheckpointMismatchError(
                f"cannot load checkpoint {path}: {reason}", path=path, reason=reason
            )
    checkpoint = ckpt_io.load(path / STATE_FILE)
    metadata = read_metadata(path)
    checkpoint["model"] = _model_entries(metadata, torch.device("meta"))
    checkpoint["sharded"] = path  # set here, never read from the file
    return checkpoint


def optimizer_state(runner: Checkpointable) -> dict[str, Any]:
    """The optimizer's state dict keyed by parameter name, its tensors sharded like the
    parameters (DCP reshards them at load)."""
    assert runner.optimizer is not None
    return dict(get_optimizer_state_dict(runner.unwrapped_model, runner.optimizer))


def restore_tensors(runner: Checkpointable, checkpoint: dict[str, Any], resume: bool) -> None:
    """Read the model's (and with ``resume`` the optimizer's) tensors of the folder
    ``checkpoint["sharded"]`` into ``runner``, resharded to this run's ranks (every rank
    calls this; a run without FSDP reads whole tensors)."""
    model, optimizer = runner.unwrapped_model, runner.optimizer
    wanted: dict[str, Any] = {"model": get_model_state_dict(model)}
    saved = checkpoint.get("optimizers", {}).get(SINGLE)
    if resume and optimizer is not None and saved is not None:
        template: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer))
        wanted["optimizer"] = {
            name: {k: v for k, v in entry.items() if isinstance(v, torch.Tensor)}
            for name, entry in template["state"].items()
        }
    _read(wanted, checkpoint["sharded"], alone=not collectives.is_distributed())
    set_model_state_dict(model, wanted["model"])
    if optimizer is not None and "optimizer" in wanted:
        state = {
            name: {**saved["state"].get(name, {}), **tensors}
            for name, tensors in wanted["optimizer"].items()
        }
        whole: Any = {"state": state, "param_groups": saved["param_groups"]}
        set_optimizer_state_dict(model, optimizer, whole)


def restore_whole(runner: Checkpointable, checkpoint: dict[str, Any], resume: bool) -> None:
    """A checkpoint file (whole tensors, the optimizer's entries keyed by position, as DDP
    and one process save them) into the sharded model and optimizer: each rank keeps its
    shards of every tensor."""
    model, optimizer = runner.unwrapped_model, runner.optimizer
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, checkpoint["model"], options=whole)
    saved = checkpoint.get("optimizers", {}).get(SINGLE)
    if not (resume and optimizer is not None and saved is not None):
        return
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    keyed: Any = {
        "state": {order[i]: entry for i, entry in saved["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in saved["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, keyed, options=whole)


def full_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The whole model state dict of folder ``path`` in this process alone (no process
    group needed): what ``hookrun export`` writes."""
    weights = _model_entries(read_metadata(path), torch.device("cpu"))
    _read({"model": weights}, path, alone=True)
    return weights


def full_plugin_states(path: Path, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The plugins' states of folder ``path`` (``checkpoint`` is its :func:`load`), every
    tensor whole, in this process alone: what ``hookrun export --ema`` writes."""
    return _fill_plugins(checkpoint, path, None, alone=True)


def _read(wanted: dict[str, Any], path: Path, alone: bool) -> None:
    """Fill ``wanted``'s tensors from folder ``path``; ``alone``: this process reads whole
    tensors without a process group (DCP warns that it assumes so: it is meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(wanted, storage_reader=SafeReader(path), no_dist=alone)


def _model_entries(metadata: Metadata, device: torch.device) -> dict[str, torch.Tensor]:
    """Empty tensors of the saved model's names, global shapes and dtypes."""
    entries: dict[str, Any] = metadata.state_dict_metadata  # all tensors (read_metadata)
    return {
        key.removeprefix("model."): torch.empty(md.size, dtype=md.properties.dtype, device=device)
        for key, md in entries.items()
        if key.startswith("model.")
    }


# -- reading DCP's metadata without unpickling arbitrary objects ------------------------------

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a name of torch's layouts to the layout
    "pathlib": {"PosixPath", "WindowsPath", "Path"},  # StorageMeta's checkpoint_id, unused
    "torch": {
        "Size",
        "strided",
        "sparse_coo",
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    },
    "collections": {"OrderedDict"},
    "copyreg": {"_reconstructor"},
    "builtins": {"object", "set", "frozenset"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and plain values, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def read_metadata(path: Path) -> Metadata:
    """DCP's ``.metadata`` of folder ``path``, read with :class:`_MetadataUnpickler`; one
    that declares a non-tensor entry is refused (DCP would unpickle it freely)."""
    file = path / METADATA_FILE
    try:
        metadata = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
        reason = f"its {METADATA_FILE} is not DCP's metadata ({exc})"
        raise CheckpointMismatchError(
            f"cannot load checkpoint {path}: {reason}", path=path, reason=reason
        ) from exc
    entries = getattr(metadata, "state_dict_metadata", None)
    bad = (
        "not a Metadata"
        if not isinstance(metadata, Metadata) or not isinstance(entries, dict)
        else next(
            (
                f"{k} is not a tensor"
                for k, v in entries.items()
                if not isinstance(v, TensorStorageMetadata)
            ),
            None,
        )
    )
    if bad:
        reason = f"its {METADATA_FILE} is refused ({bad})"
        raise CheckpointMismatchError(
            f"cannot load checkpoint {path}: {reason}", path=path, reason=reason
        )
    return metadata


class SafeReader(dcp.FileSystemReader):
    """DCP's file-system reader whose metadata comes from :func:`read_metadata`."""

    def __init__(self, path: Path) -> None:
        super().__init__(os.fspath(path))
        self.folder = path

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(self.folder)
        storage = metadata.storage_meta or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata

"""Whether a loaded checkpoint fits a run, checked before anything is changed.

:func:`fit_problems` compares a checkpoint with the runner's model, optimizer, RNG streams and
loop position without modifying either; :func:`non_finite` names weights that are NaN or
infinite. :mod:`hookrun.checkpoint.resume` uses both to choose what ``resume="auto"`` restores
and to refuse an explicit file that does not fit, with the runner left as it was.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from hookrun.engine.compiled import plain_names
from hookrun.engine.position import LoopPosition

if TYPE_CHECKING:
    from hookrun.checkpoint.checkpointable import Checkpointable

PYTHON_STATE_LENGTH = 625  # random.getstate()[1]: 624 words of MT19937 and the position
NUMPY_KEY_LENGTH = 624

# optimizer state entries torch.optim keeps with the shape of their parameter (SGD, Adam,
# AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad, Adadelta, ASGD, Rprop); others (a step
# count, Adafactor's factored moments, LBFGS's flat vectors) have shapes of their own
PARAM_SHAPED = frozenset(
    {
        "momentum_buffer",
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "square_avg",
        "grad_avg",
        "acc_delta",
        "sum",
        "ax",
        "exp_inf",
        "prev",
        "step_size",
    }
)


def fit_problems(runner: Checkpointable, checkpoint: Mapping[str, Any], resume: bool) -> list[str]:
    """What keeps ``checkpoint`` from being restored into ``runner``: one line per kind of
    problem, each with a count and the first case, e.g. ``model: 14 size mismatches, first:
    features.0.weight [32,1,3,3] (checkpoint) vs [16,1,3,3] (model)``. Empty when it fits.

    Only the weights are checked unless ``resume``; with ``resume`` the optimizer (its kind,
    groups, parameters per group, state shapes), the scheduler and scaler states (dicts,
    when present), the RNG streams (structure and sizes, tried on throwaway generators) and
    the loop position (within this run's epoch) too. Nothing is modified.
    """
    problems = _model_problems(runner.unwrapped_model.state_dict(), checkpoint)
    if not resume:
        return problems
    if runner.optimizers and "optimizers" in checkpoint:
        meta = checkpoint.get("meta")
        kinds = meta.get("optimizers") if isinstance(meta, Mapping) else None
        problems += _optimizers_problems(
            runner.optimizers, checkpoint["optimizers"], kinds if isinstance(kinds, Mapping) else {}
        )
    for key, present in (("schedulers", bool(runner.schedulers)), ("scaler", runner.scaler)):
        if present and key in checkpoint and not isinstance(checkpoint[key], Mapping):
            problems.append(f"{key}: {_kind(checkpoint[key])}, not a state dict")
    if not isinstance(checkpoint.get("plugins", {}), Mapping):
        problems.append(f"plugins: {_kind(checkpoint['plugins'])}, not a dict")
    problems += _rng_problems(checkpoint, runner.rank, runner.world_size)
    loader = runner.train_loader
    per_epoch = None if loader is None or loader.stream else loader.length
    by_epoch = runner.validation_schedule.by_epoch  # validated closes the epoch
    problems += _loop_problems(checkpoint, per_epoch, by_epoch, runner.world_size)
    return problems


def disagreement(resumed: list[tuple[str | None, int]]) -> str | None:
    """The line that says the ranks did not all resume from the same checkpoint, given each
    rank's (file name or None for a fresh start, iteration), in rank order; None when they
    agree. Ranks that read different folders (no shared storage) would otherwise run out of
    step until a collective fails."""
    if all(entry == resumed[0] for entry in resumed):
        return None
    seen = [
        f"rank {rank} {name or 'nothing (fresh start)'} at iteration {it}"
        for rank, (name, it) in enumerate(resumed)
    ]
    return (
        "ranks resumed from different checkpoints: "
        + ", ".join(seen)
        + "; every rank must read the same checkpoint folder (shared storage)"
    )


def summary(problems: list[str]) -> str:
    """``problems`` on one line."""
    return "; ".join(problems)


def non_finite(weights: Any) -> str | None:
    """``nan in fc.weight`` (and how many more tensors) when a floating tensor of
    ``weights`` (a model state dict) holds a NaN or an infinity; None when all are finite."""
    if not isinstance(weights, Mapping):
        return None
    found = []
    for key, value in weights.items():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.is_meta:
            continue  # meta: a sharded checkpoint's shapes, its values not read yet
        if not bool(torch.isfinite(value).all()):
            found.append((key, "nan" if bool(torch.isnan(value).any()) else "inf"))
    if not found:
        return None
    key, kind = found[0]
    more = f" and {_count(len(found) - 1, 'more tensor')}" if len(found) > 1 else ""
    return f"{kind} in {key}{more}"


# -- the parts -------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    return f"a {type(value).__name__}"


def _shape(value: Any) -> str:
    return "[" + ",".join(str(n) for n in value.shape) + "]"


def _count(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _counted(count: int, what: str, first: str) -> str:
    """``14 size mismatches, first: ...`` (``what`` is singular; ``es`` after ``ch``)."""
    plural = what if count == 1 else what + ("es" if what.endswith("ch") else "s")
    return f"{count} {plural}, first: {first}"


def _model_problems(expected: Mapping[str, Any], checkpoint: Mapping[str, Any]) -> list[str]:
    if "model" not in checkpoint:
        return ["no 'model' entry (not a complete checkpoint)"]
    saved = checkpoint["model"]
    if not isinstance(saved, Mapping):
        return [f"model: {_kind(saved)}, not a state dict"]
    saved = plain_names(saved)  # torch.compile's wrapper names load as the plain ones
    problems = []
    missing = [key for key in expected if key not in saved]
    unexpected = [key for key in saved if key not in expected]
    if missing:
        problems.append("model: " + _counted(len(missing), "missing key", str(missing[0])))
    if unexpected:
        first = str(unexpected[0])
        problems.append("model: " + _counted(len(unexpected), "unexpected key", first))
    mismatched = []
    for key, want in expected.items():
        if key not in saved or not isinstance(want, torch.Tensor):
            continue  # extra state (any object) is the module's to check
        got = saved[key]
        if not isinstance(got, torch.Tensor):
            mismatched.append(f"{key} is {_kind(got)}, not a tensor")
        elif isinstance(want, torch.nn.parameter.UninitializedParameter):
            continue  # a lazy module takes the shape it is given
        elif got.shape != want.shape:
            mismatched.append(f"{key} {_shape(got)} (checkpoint) vs {_shape(want)} (model)")
    if mismatched:
        problems.append("model: " + _counted(len(mismatched), "size mismatch", mismatched[0]))
    return problems


def _optimizers_problems(
    optimizers: Mapping[str, torch.optim.Optimizer], saved: Any, kinds: Mapping[str, Any]
) -> list[str]:
    """Each optimizer against its state by name; a run and a checkpoint with other names
    (or another number of optimizers) do not fit."""
    if not isinstance(saved, Mapping):
        return [f"optimizers: {_kind(saved)}, not a mapping of names to states"]
    if set(saved) != set(optimizers):
        return [
            f"optimizers: the checkpoint holds {', '.join(map(repr, saved)) or 'none'} and this "
            f"run has {', '.join(map(repr, optimizers))}"
        ]
    problems = []
    for name, optimizer in optimizers.items():
        label = "optimizer" if len(optimizers) == 1 else f"optimizer {name!r}"
        found = _optimizer_problems(optimizer, saved[name], kinds.get(name))
        problems += [label + line.removeprefix("optimizer") for line in found]
    return problems


def _optimizer_problems(
    optimizer: torch.optim.Optimizer, saved: Any, saved_name: Any = None
) -> list[str]:
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    state = saved.get("state") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list) or not isinstance(state, Mapping):
        return ["optimizer: not an optimizer state dict (no 'param_groups' list and 'state')"]
    current = optimizer.param_groups
    other = _other_kind(groups, current)
    if other:
        name = type(optimizer).__name__
        kind = saved_name if isinstance(saved_name, str) else "another optimizer's"
        return [f"optimizer: {kind} state cannot restore {name} ({other})"]
    if len(groups) != len(current):
        return [
            f"optimizer: {_count(len(groups), 'parameter group')} in the checkpoint, "
            f"{len(current)} in the optimizer"
        ]
    ids: list[Any] = []
    for i, (group, live) in enumerate(zip(groups, current, strict=True)):
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, list):
            return [f"optimizer: parameter group {i} has no 'params' list"]
        if len(params) != len(live["params"]):
            return [
                f"optimizer: parameter group {i} has {_count(len(params), 'parameter')} in "
                f"the checkpoint, {len(live['params'])} in the optimizer"
            ]
        ids += params
    position = {pid: n for n, pid in enumerate(ids) if isinstance(pid, (int, str))}
    live_params = [p for group in current for p in group["params"]]
    mismatched = []
    for pid, entry in state.items():
        if pid not in position:
            mismatched.append(f"state for parameter {pid!r}, which no group lists")
            continue
        if not isinstance(entry, Mapping):
            mismatched.append(f"state of parameter {pid!r} is {_kind(entry)}")
            continue
        param = live_params[position[pid]]
        for name, value in entry.items():
            shaped = name in PARAM_SHAPED and isinstance(value, torch.Tensor)
            if shaped and value.shape != param.shape:
                mismatched.append(
                    f"{name} of parameter {pid!r} {_shape(value)} (checkpoint) vs "
                    f"{_shape(param)} (parameter)"
                )
    if mismatched:
        return ["optimizer: " + _counted(len(mismatched), "state mismatch", mismatched[0])]
    return []


def _other_kind(groups: list[Any], current: list[dict[str, Any]]) -> str | None:
    """What shows that ``groups`` (a checkpoint's parameter groups) belong to another kind of
    optimizer than ``current``: settings each side has and the other lacks (SGD's
    ``momentum`` against Adam's ``betas``). A torch release adds settings to one side only,
    which is no other kind: its ``load_state_dict`` fills them in."""
    if not groups or not current or not isinstance(groups[0], Mapping):
        return None
    saved, live = set(groups[0]) - {"params"}, set(current[0]) - {"params"}
    if not saved - live or not live - saved:
        return None
    return (
        f"its settings {', '.join(sorted(saved - live))} against "
        f"{', '.join(sorted(live - saved))} here"
    )


def _rng_problems(checkpoint: Mapping[str, Any], rank: int, world_size: int) -> list[str]:
    if "rng" not in checkpoint:
        return ["no 'rng' entry (saved with weights only?)"]
    ranks = checkpoint.get("rng_ranks") or [checkpoint["rng"]]
    if not isinstance(ranks, list):
        return [f"rng_ranks: {_kind(ranks)}, not a list"]
    state = ranks[rank] if len(ranks) == world_size else ranks[0]
    where = f"rng_ranks[{rank}]" if len(ranks) == world_size and len(ranks) > 1 else "rng"
    problem = _rng_problem(state)
    return [f"{where}: {problem}"] if problem else []


def _rng_problem(state: Any) -> str | None:
    """Why ``state`` cannot be given to
    :func:`hookrun.checkpoint.random_state.set_rng_state`, tried on generators of their own
    (the process's streams stay as they are)."""
    if not isinstance(state, Mapping):
        return f"{_kind(state)}, not a dict"
    for key in ("python", "torch"):
        if key not in state:
            return f"no {key!r} state"
    py = state["python"]
    try:
        internal = py["state"]
        if not isinstance(internal, torch.Tensor) or internal.numel() != PYTHON_STATE_LENGTH:
            size = internal.numel() if isinstance(internal, torch.Tensor) else _kind(internal)
            return f"python state has {size} values, not {PYTHON_STATE_LENGTH}"
        random.Random().setstate((py["version"], tuple(internal.tolist()), py["gauss"]))
    except Exception as exc:
        return f"python state does not restore ({type(exc).__name__}: {exc})"
    problem = _generator_problem("torch", state["torch"], torch.get_rng_state())
    if problem:
        return problem
    cuda = state.get("cuda") or []
    if not isinstance(cuda, (list, tuple)):
        return f"cuda state is {_kind(cuda)}, not a list"
    if cuda and torch.cuda.is_available():
        if len(cuda) > torch.cuda.device_count():
            return f"cuda state of {len(cuda)} devices, {torch.cuda.device_count()} here"
        for i, value in enumerate(cuda):
            problem = _generator_problem(f"cuda[{i}]", value, torch.cuda.get_rng_state(i))
            if problem:
                return problem
    if "numpy" in state:
        return _numpy_problem(state["numpy"])
    return None


def _generator_problem(name: str, value: Any, reference: torch.Tensor) -> str | None:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
        kind = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else _kind(value)
        return f"{name} state is {kind}, not a uint8 tensor"
    if value.numel() != reference.numel():
        return f"{name} state has {value.numel()} bytes, not {reference.numel()}"
    if name == "torch":
        try:
            torch.Generator().set_state(value.cpu())
        except Exception as exc:
            return f"{name} state does not restore ({type(exc).__name__}: {exc})"
    return None


def _numpy_problem(npst: Any) -> str | None:
    try:
        import numpy as np
    except ImportError:
        return None
    try:
        key = npst["key"]
        if not isinstance(key, torch.Tensor) or key.numel() != NUMPY_KEY_LENGTH:
            size = key.numel() if isinstance(key, torch.Tensor) else _kind(key)
            return f"numpy key has {size} values, not {NUMPY_KEY_LENGTH}"
        np.random.RandomState().set_state(
            (
                npst["kind"],
                key.numpy().astype("uint32"),
                npst["pos"],
                npst["has_gauss"],
                npst["cached_gaussian"],
            )
        )
    except Exception as exc:
        return f"numpy state does not restore ({type(exc).__name__}: {exc})"
    return None


def _loop_problems(
    checkpoint: Mapping[str, Any], per_epoch: int | None, by_epoch: bool, world_size: int
) -> list[str]:
    """A position that is not one, or one beyond the end of this run's epoch.

    A mid-epoch position counts batches; when this run's epoch has fewer (a larger batch
    size, less data) the position names no place in it, and continuing would train the
    epoch's end twice over or count it done: refused, rather than guessed. A checkpoint of
    another number of ranks is moved to this run's ranks by the samples it used instead
    (:func:`hookrun.checkpoint.state.restore`)."""
    if "loop" not in checkpoint:
        return ["no 'loop' entry (saved with weights only?)"]
    try:
        position = LoopPosition.from_state(checkpoint["loop"])
    except Exception as exc:
        return [f"loop: not a position ({type(exc).__name__}: {exc})"]
    negative = [f"{k}={v}" for k, v in vars(position).items() if type(v) is int and v < 0]
    if negative:
        return [f"loop: negative position ({', '.join(negative)})"]
    ranks = checkpoint.get("rng_ranks")
    saved_world = len(ranks) if isinstance(ranks, list) and ranks else 1
    same_ranks = saved_world == world_size and not position.epoch_closed(by_epoch)
    if per_epoch is not None and same_ranks and position.batch > per_epoch:
        return [
            f"loop: the checkpoint is at batch {position.batch} of epoch "
            f"{position.epoch + 1} and an epoch of this run has {per_epoch} batches (the "
            "batch size or the data changed); resume with the batch size and data it was "
            "saved with"
        ]
    return []

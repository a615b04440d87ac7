"""The checkpoint plugin's record, the ledger: which files it keeps and the roles that keep
each; read from a checkpoint and checked against the folder.

Nothing read from a checkpoint is used as a path: only plain file names of the plugin's own
kinds (``epoch_<N>.pt``, ``iter_<N>.pt``, ``emergency_iter_<N>.pt``, ``best_<metric>.pt``,
``top_<metric>_<value>_iter_<N>.pt``) are taken, and a name is only used while it resolves to
a file directly in the checkpoint folder.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from hookrun import better, metric_rule
from hookrun_checkpoint.storage import Storage

Rule = Literal["greater", "less"]
Kept = list[str]  # rotating files, oldest first
Best = dict[str, dict[str, Any]]  # metric -> score, file, rule, epoch, iter
Top = dict[str, list[dict[str, Any]]]  # metric -> save_top_k entries, best first
ROTATING = re.compile(r"(?:emergency_)?iter_[0-9]+\.pt|epoch_[0-9]+\.pt")
BEST = re.compile(r"best_[A-Za-z0-9_.-]+\.pt")
TOP = re.compile(r"top_[A-Za-z0-9_.+-]+_iter_[0-9]+\.pt")


@dataclass
class Ledger:
    """The one record of the files the plugin keeps, and the roles that keep each: periodic
    files ranked by age (``max_keep`` newest), each metric's top files ranked by score
    (``save_top_k`` best), each metric's best file, the file this run resumed from, and
    ``latest``. Every kind of save proposes the next record; a file is deleted exactly when a
    save takes its last role away. What every checkpoint stores is this record itself."""

    kept: Kept = field(default_factory=list)
    best: Best = field(default_factory=dict)
    top: Top = field(default_factory=dict)
    latest: str | None = None
    resumed: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "kept": list(self.kept),
            "best": {metric: dict(entry) for metric, entry in self.best.items()},
            "top": {metric: [dict(e) for e in entries] for metric, entries in self.top.items()},
            "latest": self.latest,
            "resumed": self.resumed,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ledger:
        """A copy of a record this plugin produced itself (no checks needed)."""
        return cls(
            list(state["kept"]),
            {metric: dict(entry) for metric, entry in state["best"].items()},
            {metric: [dict(e) for e in entries] for metric, entries in state["top"].items()},
            state["latest"],
            state["resumed"],
        )

    def copy(self) -> Ledger:
        return Ledger.from_state(self.state_dict())

    def roles(self) -> dict[str, set[str]]:
        """Each file the record holds, with the roles that keep it."""
        held: dict[str, set[str]] = {}
        for name in self.kept:
            held.setdefault(name, set()).add("periodic")
        for metric, entry in self.best.items():
            held.setdefault(entry["file"], set()).add(f"best {metric}")
        for metric, entries in self.top.items():
            for entry in entries:
                held.setdefault(entry["file"], set()).add(f"top {metric}")
        for role, file in (("resumed", self.resumed), ("latest", self.latest)):
            if file is not None:
                held.setdefault(file, set()).add(role)
        return held

    def add_periodic(self, name: str, max_keep: int | None) -> None:
        """Rank ``name`` as the newest periodic file and let the oldest beyond ``max_keep``
        go (the file this run resumed from does not count)."""
        self.kept = [kept for kept in self.kept if kept != name] + [name]
        if max_keep is not None:
            rotating = [kept for kept in self.kept if kept != self.resumed]
            dropped = rotating[: max(0, len(rotating) - max_keep)]
            self.kept = [kept for kept in self.kept if kept not in dropped]

    def add_top(self, metric: str, entry: dict[str, Any], k: int) -> bool:
        """Rank ``entry`` among the metric's top files; whether it is among the ``k`` best
        (the one it pushes out loses its role)."""
        entries = [e for e in self.top.get(metric, []) if e["file"] != entry["file"]]
        kept, _ = rank_top([*entries, entry], k)
        if entry["file"] == self.resumed or all(e["file"] != entry["file"] for e in kept):
            return False
        self.top[metric] = kept
        return True

    def add_best(self, metric: str, entry: dict[str, Any]) -> bool:
        """Make ``entry`` the metric's best when it beats the best so far; whether it did."""
        held = self.best.get(metric)
        if held is not None and not better(entry["rule"], entry["score"], held["score"]):
            return False
        self.best[metric] = entry
        return True

    def released(self, before: Iterable[str]) -> list[str]:
        """Those of ``before`` (the files held before a save) that no role keeps now: the
        files to delete, each once, in order."""
        held = self.roles()
        return [name for name in dict.fromkeys(before) if name not in held]


def read_bookkeeping(state: dict[str, Any]) -> tuple[Ledger, list[tuple[str, str]]]:
    """The record a checkpoint's plugin state holds,
    keeping only plain file names of the plugin's own kinds, and (what, why) for each entry
    dropped."""
    ignored: list[tuple[str, str]] = []
    kept = state.get("kept") or []
    own_kept: Kept = []
    for name in kept if isinstance(kept, (list, tuple)) else [kept]:
        if plain_name(name, ROTATING):
            own_kept.append(name)
        else:
            ignored.append((f"kept entry {name!r}", "not a file name in"))
    best = state.get("best") or {}
    own_best: Best = {}
    for metric, entry in best.items() if isinstance(best, dict) else ():
        if best_entry(entry) is None:
            ignored.append((f"best entry {metric!r}", "not a valid entry"))
        elif not plain_name(entry["file"], BEST):
            what = f"best entry {metric!r} ({entry['file']!r})"
            ignored.append((what, "not a file name in"))
        else:
            own_best[str(metric)] = dict(entry)
    top = state.get("top") or {}
    own_top: Top = {}
    for metric, entries in top.items() if isinstance(top, dict) else ():
        for entry in entries if isinstance(entries, (list, tuple)) else [entries]:
            if best_entry(entry) is None or not plain_name(entry["file"], TOP):
                ignored.append((f"top entry {metric!r} ({entry!r})", "not a file name in"))
            else:
                own_top.setdefault(str(metric), []).append(dict(entry))
    own: dict[str, str | None] = {}
    for key in ("latest", "resumed"):
        name = state.get(key)
        own[key] = name if any(plain_name(name, kind) for kind in (ROTATING, BEST, TOP)) else None
        if name is not None and own[key] is None:
            ignored.append((f"{key} {name!r}", "not a file name in"))
    return Ledger(own_kept, own_best, own_top, own["latest"], own["resumed"]), ignored


def survey(storage: Storage, record: Ledger, save_best: Any, rule: str) -> tuple[Ledger, list[str]]:
    """The record's kept names, best and top entries whose files exist (best scores
    checked against the best files themselves), and a notice for each name that resolves
    elsewhere (a symbolic link out of the folder)."""
    notices: list[str] = []
    out_dir = storage.folder

    def usable(what: str, name: str) -> bool:
        if not storage.inside(name):
            notices.append(
                f"checkpoint: ignoring {what} from the checkpoint: it resolves outside {out_dir}"
            )
            return False
        return storage.exists(name)

    kept = [name for name in record.kept if usable(f"kept entry {name!r}", name)]
    best = {
        metric: entry
        for metric, entry in record.best.items()
        if usable(f"best entry {metric!r} ({entry['file']!r})", entry["file"])
    }
    top = {
        metric: [e for e in entries if usable(f"top entry {metric!r} ({e['file']!r})", e["file"])]
        for metric, entries in record.top.items()
    }
    resumed = record.resumed
    if resumed is not None and not usable(f"resumed {resumed!r}", resumed):
        resumed = None
    if save_best:
        best = best_on_disk(storage, best, save_best, rule, notices)
    return Ledger(kept, best, top, record.latest, resumed), notices


def best_on_disk(
    storage: Storage, best: Best, wanted: Any, rule_setting: str, notices: list[str]
) -> Best:
    """``best`` checked against the best files in ``storage``: each file says which
    scores it holds itself (its bookkeeping's entries naming it). Such a score replaces
    the bookkeeping's claim for that file, and the best of all the files' scores and the
    claims that cannot be checked (a file that does not load) is the one to beat. Only
    metrics this run saves are looked at (every one under ``save_best: auto``)."""
    held: dict[str, dict[str, dict[str, Any]]] = {}  # file -> metric -> its own entry
    for name in storage.names():
        if plain_name(name, BEST) and storage.inside(name) and storage.exists(name):
            held[name] = stored_best(storage, name)
    names = None if wanted == "auto" else {wanted} if isinstance(wanted, str) else set(wanted or ())
    result: dict[str, dict[str, Any]] = {}
    metrics = set(best) | {m for own in held.values() for m in own}
    for metric in sorted(metrics):
        if names is not None and metric not in names and metric not in best:
            continue
        candidates = [entry for own in held.values() for m, entry in own.items() if m == metric]
        claimed = best.get(metric)
        if claimed is not None and metric not in held.get(claimed["file"], {}):
            candidates.append(claimed)  # its file does not say: the claim stands
        if not candidates:
            continue
        rule = rule_for(metric, rule_setting, candidates[0]["rule"])
        top = candidates[0]
        for entry in candidates[1:]:
            if better(rule, entry["score"], top["score"]):
                top = entry
        result[metric] = dict(top)
        if claimed is None or (claimed["file"], claimed["score"]) != (
            top["file"],
            top["score"],
        ):
            notices.append(
                f"checkpoint: {top['file']} holds the best {metric} so far, "
                f"{top['score']:.6g}: only a better one replaces it"
            )
    return result


def rule_for(metric: str, rule: str, default: Rule) -> Rule:
    """The rule a run compares ``metric`` by, ``default`` when it cannot tell yet."""
    if rule in ("greater", "less"):
        return rule  # type: ignore[return-value]
    return metric_rule(metric) or default


def rank_top(
    entries: list[dict[str, Any]], k: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``k`` best of ``entries`` (best first) and the rest: by score in the direction of
    their rule, equal scores by iteration, so a tie keeps the earlier checkpoint."""

    def key(entry: dict[str, Any]) -> tuple[float, int]:
        score = float(entry["score"])
        return (-score if entry["rule"] == "greater" else score, int(entry["iter"]))

    ranked = sorted(entries, key=key)
    return ranked[:k], ranked[k:]


def plain_name(value: Any, pattern: re.Pattern[str]) -> bool:
    """Whether ``value`` is a plain file name of the kind ``pattern`` describes: a string
    without separators, NUL or a drive, not empty, ``.`` or ``..``."""
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and not any(c in value for c in "/\\\0:")
        and pattern.fullmatch(value) is not None
    )


def best_entry(entry: Any) -> dict[str, Any] | None:
    """``entry`` when it has the shape of a best entry (a file name string, a finite or
    infinite number as score, a rule), else None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        return None
    score = entry.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score):
        return None
    if entry.get("rule") not in ("greater", "less"):
        return None
    return entry


def stored_best(storage: Storage, name: str) -> dict[str, dict[str, Any]]:
    """The best entries that checkpoint ``name`` records for itself (those naming it),
    read without loading its tensors; nothing when it does not load."""
    try:
        best = storage.read_state(name)["plugins"]["checkpoint"]["best"]
        entries = best.items() if isinstance(best, dict) else ()
    except Exception:  # not a checkpoint of this plugin: it says nothing
        return {}
    return {
        str(metric): dict(entry)
        for metric, entry in entries
        if best_entry(entry) is not None and entry["file"] == name
    }


def position_name(state: dict[str, Any], by_epoch: bool) -> str:
    """``epoch_<N>.pt`` when the state sits at the end of an epoch and saving is by epoch,
    else ``iter_<N>.pt`` (N completed epochs or iterations, as in ``state["meta"]``)."""
    if by_epoch and state["loop"]["phase"] != "train":
        return f"epoch_{state['meta']['epoch']}.pt"
    return f"iter_{state['meta']['iter']}.pt"

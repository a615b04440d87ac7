"""The ledger as a unit: one record of the files kept and the roles that keep each."""

from __future__ import annotations

from hookrun_checkpoint import leftover
from hookrun_checkpoint.ledger import Ledger, rank_top


def entry(file: str, score: float, it: int) -> dict:
    return {"file": file, "score": score, "rule": "greater", "epoch": 0, "iter": it}


def test_top_k_with_ties_keeps_the_earlier() -> None:
    entries = [entry("c", 0.9, 3), entry("a", 0.9, 1), entry("b", 0.5, 2), entry("d", 0.95, 4)]
    kept, dropped = rank_top(entries, 2)
    assert [e["file"] for e in kept] == ["d", "a"]
    assert [e["file"] for e in dropped] == ["c", "b"]


def test_a_file_is_released_only_when_no_role_keeps_it() -> None:
    ledger = Ledger(kept=["epoch_1.pt", "epoch_2.pt"], best={"acc": entry("epoch_1.pt", 0.9, 1)})
    ledger.latest = "epoch_2.pt"
    dropped = ledger.rotate(1, protected=None)
    assert dropped == ["epoch_1.pt"]
    assert ledger.release(dropped, protected=None) == []  # still the best file
    ledger.best["acc"] = entry("epoch_2.pt", 0.95, 2)
    assert ledger.release(dropped, protected=None) == ["epoch_1.pt"]
    assert ledger.release(["epoch_2.pt"], protected=None) == []  # periodic, best and latest
    assert ledger.release(["epoch_9.pt"], protected="epoch_9.pt") == []


def test_only_the_core_temporary_names_of_own_files_are_leftovers() -> None:
    assert leftover(".iter_4.pt.0123456789ab.tmp")
    assert leftover(".latest.0123456789ab.tmp")
    assert leftover(".epoch_2.pt.partial")
    assert not leftover(".notes.txt.0123456789ab.tmp")  # not a file of this plugin
    assert not leftover(".iter_4.pt.mine.tmp")  # not the core's marker

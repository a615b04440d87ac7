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
    ledger = Ledger(kept=["epoch_1.pt"], best={"acc": entry("epoch_1.pt", 0.9, 1)})
    before = list(ledger.roles())
    ledger.add_periodic("epoch_2.pt", max_keep=1)
    ledger.latest = "epoch_2.pt"
    assert ledger.kept == ["epoch_2.pt"]
    assert ledger.released(before) == []  # epoch_1.pt is still the best file
    before = list(ledger.roles())
    assert ledger.add_best("acc", entry("epoch_2.pt", 0.95, 2))
    assert ledger.released(before) == ["epoch_1.pt"]
    assert ledger.roles()["epoch_2.pt"] == {"periodic", "best acc", "latest"}
    assert not ledger.add_best("acc", entry("epoch_3.pt", 0.95, 3))  # a tie is no new best


def test_the_file_a_run_resumed_from_keeps_its_role_and_does_not_count() -> None:
    ledger = Ledger(kept=["iter_4.pt"], resumed="iter_4.pt", latest="iter_4.pt")
    for n in (8, 12, 16):
        before = list(ledger.roles())
        ledger.add_periodic(f"iter_{n}.pt", max_keep=2)
        ledger.latest = f"iter_{n}.pt"
        released = ledger.released(before)
    assert ledger.kept == ["iter_4.pt", "iter_12.pt", "iter_16.pt"]
    assert released == ["iter_8.pt"]
    ledger = Ledger(resumed="top_acc_0.9_iter_4.pt")
    assert not ledger.add_top("acc", entry("top_acc_0.9_iter_4.pt", 0.9, 4), 2)
    assert ledger.top == {}  # the resume point is never written again


def test_top_k_pushes_out_the_worst_and_releases_its_file() -> None:
    ledger = Ledger()
    for n, score in enumerate((0.5, 0.9, 0.7, 0.2)):
        before = list(ledger.roles())
        added = ledger.add_top("acc", entry(f"top_acc_{score}_iter_{n}.pt", score, n), 2)
        released = ledger.released(before)
        assert added == (score != 0.2)
    assert [e["file"] for e in ledger.top["acc"]] == [
        "top_acc_0.9_iter_1.pt",
        "top_acc_0.7_iter_2.pt",
    ]
    assert released == []  # 0.2 never entered
    assert ledger.state_dict() == Ledger.from_state(ledger.state_dict()).state_dict()


def test_only_the_core_temporary_names_of_own_files_are_leftovers() -> None:
    assert leftover(".iter_4.pt.0123456789ab.tmp")
    assert leftover(".latest.0123456789ab.tmp")
    assert leftover(".epoch_2.pt.partial")
    assert not leftover(".notes.txt.0123456789ab.tmp")  # not a file of this plugin
    assert not leftover(".iter_4.pt.mine.tmp")  # not the core's marker

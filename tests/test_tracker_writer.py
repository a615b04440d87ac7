"""``hookrun.TrackerWriter`` as a third-party tracker writer uses it: its option checks
through ``hookrun config validate`` (the writer installed as a distribution), and which
checkpoint files it uploads, once each, across passes and a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hookrun import TrackerWriter
from hookrun.testing import run_cli, write_toy_task

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

#: A tracker writer as its author would ship it; ``Present`` differs only in its library,
#: one that is installed wherever hookrun is.
ACME_SOURCE = """
from hookrun import TrackerWriter


class AcmeWriter(TrackerWriter):
    name = "acme"
    library = "acme_tracker_not_installed"
    install = "'acme-tracker>=2'"
    modes = ("online", "offline")
    owned_init_kwargs = frozenset({"project", "mode"})

    def __init__(
        self,
        work_dir,
        project="hookrun",
        mode=None,
        log_checkpoints="none",
        checkpoint_dir=None,
        init_kwargs=None,
    ):
        super().__init__(work_dir, log_checkpoints, checkpoint_dir)
        self.project, self.mode, self.init_kwargs = project, mode, dict(init_kwargs or {})

    @classmethod
    def check_own_options(cls, options):
        return [] if options.get("project", "hookrun") else ["project: a name (got '')"]

    def write_scalars(self, scalars, step):
        pass


class Present(AcmeWriter):
    library = "hookrun"
"""

BAD = (
    "runner.writers={acme: {project: '', mode: airplane, log_checkpoints: all,"
    " init_kwargs: {project: x, mode: offline, entity: team}}}"
)


MISSING = (
    "runner.writers.acme: the acme_tracker_not_installed library is missing: "
    "pip install 'acme-tracker>=2'"
)
"""The line a missing library gets: the writer's path, then the line as it is (the docs of
each tracker writer show this form)."""


@pytest.fixture
def acme_config(make_dist: Any, tmp_path: Path) -> Path:
    """A toy task's config, and the ``acme`` and ``present`` writers installed."""
    make_dist(
        "hookrun-acme",
        "hookrun_acme",
        ACME_SOURCE,
        {"hookrun.writers": {"acme": "hookrun_acme:AcmeWriter", "present": "hookrun_acme:Present"}},
    )
    return write_toy_task(
        tmp_path,
        "task: toytask.py:build\nrunner: {max_epochs: 1, device: cpu, writers: [jsonl]}\n",
    )


def test_config_validate_names_each_shared_problem_in_constructor_order(
    acme_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "config", "validate", acme_config, "--set", BAD)
    assert (code, out) == (2, "")
    missing, *lines = err.splitlines()
    assert missing == MISSING
    assert lines == [
        "runner.writers.acme.project: a name (got '')",
        "runner.writers.acme.mode: expected one of online, offline (got 'airplane')",
        "runner.writers.acme.log_checkpoints: expected one of best, last, none (got 'all')",
        "runner.writers.acme.init_kwargs.mode: set by the writer (use its own options)",
        "runner.writers.acme.init_kwargs.project: set by the writer (use its own options)",
    ]


def test_right_options_leave_only_a_missing_library_to_report(
    acme_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    right = "{project: p, mode: offline, log_checkpoints: best, init_kwargs: {entity: team}}"
    code, _, err = run_cli(
        capsys, "config", "validate", acme_config, "--set", f"runner.writers={{acme: {right}}}"
    )
    (missing,) = err.splitlines()
    assert (code, missing) == (2, MISSING)
    code, _, err = run_cli(
        capsys, "config", "validate", acme_config, "--set", f"runner.writers={{present: {right}}}"
    )
    assert (code, err) == (0, "")


class Acme(TrackerWriter):
    """The least a tracker writer defines; ``uploads`` stands for what its service holds."""

    name = "acme"

    def __init__(self, work_dir: Path, **options: Any) -> None:
        super().__init__(work_dir, **options)
        self.uploads: list[str] = []

    def write_scalars(self, scalars: Any, step: int) -> None:
        pass

    def finish(self, status: str) -> None:
        for path in self.checkpoints_to_upload():
            self.uploads.append(path.name)
            self.mark_uploaded(path)


def saved_then_loaded(state: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """``state`` after a trip through a checkpoint file, loaded as a resume loads it."""
    torch.save({"writers": {"acme": state}}, tmp_path / "state.pt")
    return torch.load(tmp_path / "state.pt", weights_only=True)["writers"]["acme"]


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    """The run's checkpoint folder: two best files, an epoch file the ``latest`` pointer
    names, and another epoch file."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("best_acc_0.7.pt", "best_acc_0.9.pt", "epoch_1.pt", "epoch_2.pt"):
        (folder / name).write_bytes(f"weights of {name}".encode())
    (folder / "latest").write_text("epoch_2.pt\n")
    return folder


def test_best_files_are_uploaded_once_across_passes_and_a_resume(
    tmp_path: Path, checkpoints: Path
) -> None:
    first = Acme(tmp_path, log_checkpoints="best")
    assert [p.name for p in first.checkpoints_to_upload()] == ["best_acc_0.7.pt", "best_acc_0.9.pt"]
    first.finish("finished")
    assert first.uploads == ["best_acc_0.7.pt", "best_acc_0.9.pt"]
    assert first.checkpoints_to_upload() == []

    (checkpoints / "best_acc_0.95.pt").write_bytes(b"a better model")
    resumed = Acme(tmp_path, log_checkpoints="best")
    resumed.load_state_dict(saved_then_loaded(first.state_dict(), tmp_path))
    resumed.finish("finished")
    assert resumed.uploads == ["best_acc_0.95.pt"]  # only the file the first pass did not see


def test_last_is_the_file_latest_names_and_a_rewritten_one_counts_as_new(
    tmp_path: Path, checkpoints: Path
) -> None:
    writer = Acme(tmp_path, log_checkpoints="last")
    writer.finish("finished")
    assert writer.uploads == ["epoch_2.pt"]
    again = Acme(tmp_path, log_checkpoints="last")
    again.load_state_dict(saved_then_loaded(writer.state_dict(), tmp_path))
    assert again.checkpoints_to_upload() == []
    (checkpoints / "epoch_2.pt").write_bytes(b"epoch 2, saved again after a longer run")
    assert [p.name for p in again.checkpoints_to_upload()] == ["epoch_2.pt"]


def test_checkpoint_dir_and_none_choose_where_and_whether_to_look(
    tmp_path: Path, checkpoints: Path
) -> None:
    elsewhere = tmp_path / "exported"
    elsewhere.mkdir()
    (elsewhere / "best_loss_0.1.pt").write_bytes(b"exported")
    chosen = Acme(tmp_path, log_checkpoints="best", checkpoint_dir="exported")
    assert chosen.checkpoints_to_upload() == [elsewhere / "best_loss_0.1.pt"]
    assert Acme(tmp_path, log_checkpoints="none").checkpoints_to_upload() == []
    assert Acme(tmp_path).checkpoints_to_upload() == []  # none is the default

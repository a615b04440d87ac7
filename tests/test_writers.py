"""Writers: TensorBoard event files read back, JSONL lines, writers from entry points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hookrun import Runner, Writer, hookimpl
from hookrun.errors import ConfigError
from hookrun.testing import toy_runner_kwargs


class EveryTwo:
    """A hook writing a scalar of its own every two iterations, beside the core's reports."""

    @hookimpl
    def after_train_iter(self, runner):
        if runner.every_n_iters(2):
            runner.write_scalars(
                {"custom/loss": runner.scalars.mean(["train/loss"], 2)["train/loss"]}
            )


def read_events(folder):
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_and_jsonl_hold_the_expected_tags_and_steps(tmp_path):
    runner = Runner(
        **toy_runner_kwargs(
            tmp_path, hooks=[EveryTwo()], max_epochs=2, writers=("jsonl", "tensorboard")
        )
    )
    runner.train()
    events = read_events(tmp_path / "run" / "tensorboard")
    assert set(events) == {
        "custom/loss",
        "train/loss",
        "train/lr",
        "val/loss",
        "val/accuracy",
    }
    assert [s for s, _ in events["custom/loss"]] == [2, 4, 6]
    assert [s for s, _ in events["train/loss"]] == [3, 6]  # the core's epoch-end reports
    assert [s for s, _ in events["val/accuracy"]] == [3, 6]
    assert events["val/loss"][-1][1] == pytest.approx(runner.last_metrics["val"]["loss"])
    lines = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert "config" in lines.pop(0)  # the core writes the config first
    assert [line["step"] for line in lines] == [2, 3, 3, 4, 6, 6, 6]
    assert lines[2]["val/accuracy"] == pytest.approx(events["val/accuracy"][0][1])


def test_thousands_of_scalars_all_reach_the_event_file(tmp_path):
    from hookrun.writers import TensorBoardWriter

    writer = TensorBoardWriter(tmp_path)
    for step in range(5000):
        writer.write_scalars({"a": float(step)}, step)
    writer.close()
    assert len(read_events(tmp_path / "tensorboard")["a"]) == 5000


def test_every_write_is_readable_at_once_without_background_threads(tmp_path):
    import threading

    from hookrun.writers import TensorBoardWriter

    threads = threading.active_count()
    writer = TensorBoardWriter(tmp_path)
    for step in range(1, 301):
        writer.write_scalars({"train/loss": 1 / step, "train/lr": 0.1, "odd tag!": step}, step)
    assert threading.active_count() == threads
    events = read_events(tmp_path / "tensorboard")  # neither flushed nor closed
    assert set(events) == {"train/loss", "train/lr", "odd_tag_"}  # add_scalar's tag cleaning
    assert events["train/loss"][-1] == (300, pytest.approx(1 / 300))
    assert [s for s, _ in events["odd_tag_"]] == list(range(1, 301))
    writer.close()


def test_two_writers_opened_in_the_same_second_keep_both_files(tmp_path):
    from hookrun.writers import TensorBoardWriter

    first, second = TensorBoardWriter(tmp_path), TensorBoardWriter(tmp_path)
    first.write_scalars({"train/loss": 1.0}, 1)
    second.write_scalars({"test/accuracy": 0.5}, 1)
    first.close()
    second.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert set(read_events(tmp_path / "tensorboard")) == {"train/loss", "test/accuracy"}


def test_writer_from_an_installed_distribution(make_dist, tmp_path):
    make_dist(
        "hookrun-memwriter",
        "memwriter_mod",
        """
        from hookrun import Writer
        RECORDS = []
        class MemWriter(Writer):
            def __init__(self, work_dir, prefix="m"):
                super().__init__(work_dir)
                self.prefix = prefix
            def write_scalars(self, scalars, step):
                RECORDS.append((self.prefix, step, dict(scalars)))
        """,
        {"hookrun.writers": {"memory": "memwriter_mod:MemWriter"}},
    )
    import sys

    sys.modules.pop("memwriter_mod", None)
    Runner(**toy_runner_kwargs(tmp_path, writers={"memory": {"prefix": "x"}}, max_epochs=1)).train()
    records = sys.modules["memwriter_mod"].RECORDS
    val = [
        (prefix, step, set(scalars)) for prefix, step, scalars in records if "val/loss" in scalars
    ]
    assert val == [("x", 3, {"val/loss", "val/accuracy"})]


def test_unknown_writer_option_is_a_config_error_before_training(tmp_path):
    with pytest.raises(ConfigError) as info:
        Runner(**toy_runner_kwargs(tmp_path, writers={"tensorboard": {"flush_secs": 5}}))
    assert str(info.value) == (
        "runner.writers.tensorboard.flush_secs: unknown option (options: subdir)"
    )
    assert not (tmp_path / "run").exists()


def test_unknown_writer_name(tmp_path):
    with pytest.raises(
        ConfigError, match=r"writers.tensorbord: unknown writer \(did you mean 'tensorboard'\?\)"
    ):
        Runner(**toy_runner_kwargs(tmp_path, writers=("tensorbord",)))


class Recorder(Writer):
    """A writer instance that records how each pass ended and what state it was given."""

    name = "recorder"

    def __init__(self):
        super().__init__(".")
        self.ends, self.given, self.run_id = [], [], None

    def write_scalars(self, scalars, step):
        self.run_id = self.run_id or "run-0"

    def finish(self, status):
        self.ends.append(status)

    def state_dict(self):
        return {"run_id": self.run_id} if self.run_id else {}

    def load_state_dict(self, state):
        self.given.append(dict(state))
        self.run_id = state["run_id"]


class Fail:
    @hookimpl
    def before_train_iter(self, runner):
        if runner.iter == 2:
            raise ValueError("boom")


class StopAt:
    """Sends this process SIGINT after iteration 2: a stop signal."""

    @hookimpl
    def after_train_iter(self, runner):
        if runner.iter == 1:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGINT)


def test_writers_finish_with_the_run_status_and_keep_their_state(tmp_path):
    from hookrun.testing import SaveEvery

    writer = Recorder()
    runner = Runner(**toy_runner_kwargs(tmp_path, writers=[writer], hooks=[SaveEvery(3)]))
    runner.train()
    runner.test_dataloader = None
    runner.val()  # a later pass of the same Runner reopens with the state the last one left
    assert writer.ends == ["finished", "finished"]
    assert writer.given == [{"run_id": "run-0"}]
    saved = torch.load(tmp_path / "run" / "checkpoints" / "epoch_1.pt", weights_only=True)
    assert saved["writers"] == {"recorder": {"run_id": "run-0"}}

    resumed = Recorder()
    kwargs = toy_runner_kwargs(tmp_path, writers=[resumed], max_epochs=3)
    Runner(**kwargs).train(resume=tmp_path / "run" / "checkpoints" / "epoch_1.pt")
    assert resumed.given == [{"run_id": "run-0"}] and resumed.ends == ["finished"]

    failing = Recorder()
    with pytest.raises(ValueError, match="boom"):
        Runner(**toy_runner_kwargs(tmp_path / "f", writers=[failing], hooks=[Fail()])).train()
    assert failing.ends == ["failed"]

    stopped = Recorder()
    with pytest.raises(KeyboardInterrupt):  # SIGINT is re-delivered after the writers close
        Runner(**toy_runner_kwargs(tmp_path / "s", writers=[stopped], hooks=[StopAt()])).train()
    assert stopped.ends == ["killed"]


@pytest.mark.parametrize(
    ("status", "shown"),
    [("finished", "STATUS_SUCCESS"), ("failed", "STATUS_FAILURE"), ("killed", "STATUS_UNKNOWN")],
)
def test_tensorboard_shows_how_the_run_ended(tmp_path, status, shown):
    """The HParams session ends with the run's status, read back by TensorBoard; a run a
    stop signal ended (to be resumed) is unknown: TensorBoard has no "stopped"."""
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    from hookrun.writers.tensorboard import TensorBoardWriter

    writer = TensorBoardWriter(tmp_path)
    writer.write_config({"runner": {"max_epochs": 2}})
    writer.write_scalars({"val/loss": 0.5}, step=4)
    writer.finish(status)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_end_info"]
    end = plugin_data_pb2.HParamsPluginData.FromString(content).session_end_info
    assert api_pb2.Status.Name(end.status) == shown


def test_a_tracker_writer_not_installed_names_its_folder_in_the_repository(monkeypatch):
    """Run from a clone, a writer whose ``writers/hookrun-<name>`` folder is beside the core
    names that folder; the folders are also the names a misspelling is matched against."""
    import hookrun.writers.registry
    from hookrun.writers.registry import writer_errors

    monkeypatch.setattr(hookrun.writers.registry, "installed", lambda group: {})  # none installed
    root = Path(__file__).resolve().parent.parent
    assert (root / "writers" / "hookrun-neptune" / "pyproject.toml").is_file()
    assert writer_errors(["neptune", "nepture", "comet"]) == [
        "runner.writers.neptune: writer 'neptune' is not installed; pip install "
        f"{root / 'writers' / 'hookrun-neptune'}",
        "runner.writers.nepture: unknown writer (did you mean 'neptune'?)",
        "runner.writers.comet: unknown writer",
    ]


@pytest.mark.parametrize("name", ["mlflow", "wandb", "dvclive", "neptune"])
def test_a_tracker_writer_without_its_library_names_the_requirement_it_declares(name, monkeypatch):
    """The line's install command is the library requirement of the writer's distribution
    (its metadata), not the writer itself, which is installed."""
    import importlib.metadata
    import importlib.util

    from hookrun.hooks.discovery import WRITER_GROUP, installed

    found = installed(WRITER_GROUP).get(name)
    if found is None:
        pytest.skip(f"hookrun-{name} is not installed here")
    writer = found.entry_point.load()
    declared = importlib.metadata.requires(found.distribution) or []
    (library,) = [r for r in declared if not r.startswith("hookrun")]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda module, *a: None if module == name else real(module, *a)
    )
    errors = writer.check_options({})
    prefix = f"the {name} library is missing: pip install "
    (line,) = [e for e in errors if e.startswith(prefix)]
    assert Requirement(line.removeprefix(prefix).strip("'")) == Requirement(library)

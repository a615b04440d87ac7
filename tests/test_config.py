"""hookrun.config in-process: overrides, task loading, resolved config, settings rows."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from hookrun import PluginSettings
from hookrun.config import (
    apply_overrides,
    check_task_result,
    load,
    load_task,
    settings_rows,
)
from hookrun.errors import ConfigError


def test_overrides_parse_yaml_and_turn_true_into_a_mapping():
    data = {"runner": {"max_epochs": 5}, "plugins": {"ema": True}}
    errors = apply_overrides(
        data,
        [
            "runner.max_epochs=3",
            "plugins.ema.decay=0.99",
            "runner.writers=[jsonl]",
            "runner.amp=null",
            "task_args.name=abc",
            "runner.max_epochs.x=1",
            "nokey",
        ],
    )
    assert data["runner"] == {"max_epochs": 3, "writers": ["jsonl"], "amp": None}
    assert data["plugins"] == {"ema": {"decay": 0.99}}
    assert data["task_args"] == {"name": "abc"}
    assert errors == [
        "--set runner.max_epochs.x=1: runner.max_epochs is not a mapping",
        "--set nokey: expected KEY=VALUE with a dotted KEY (a.b=1)",
    ]


def test_task_file_is_relative_to_the_config_and_resolved_when_saved(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "job.py").write_text("def build(k=1):\n    return {'model': k}\n")
    (tmp_path / "cfg" / "c.yaml").write_text("task: job.py:build\nrunner: {work_dir: out}\n")
    monkeypatch.chdir(tmp_path)
    loaded = load(Path("cfg/c.yaml"), ["runner.seed=7"])
    assert loaded.work_dir == Path("out")  # relative to the current directory
    resolved = loaded.resolved()
    assert resolved["task"] == f"{tmp_path / 'cfg' / 'job.py'}:build"
    assert resolved["runner"]["work_dir"] == str(tmp_path / "out")
    assert resolved["runner"]["seed"] == 7 and resolved["runner"]["val_interval"] == 1
    build = load_task(loaded.data["task"], loaded.path)
    assert build(k=2) == {"model": 2}
    with pytest.raises(ConfigError, match=r"has no 'buidl' \(did you mean 'build'\?\)"):
        load_task("job.py:buidl", loaded.path)


def test_module_task_is_imported_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "mytask_mod.py").write_text("def make():\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    assert load_task("mytask_mod:make", tmp_path / "c.yaml")() == 1


def test_task_result_must_be_a_mapping_of_runner_objects():
    with pytest.raises(ConfigError) as err:
        check_task_result({"modle": 1, "optimiser": 2}, "t:b")
    assert err.value.lines == [
        "task: t:b returned unknown key 'modle' (did you mean 'model'?) (allowed: model, "
        "train_dataloader, val_dataloader, test_dataloader, optimizer, scheduler, criterion, "
        "metrics, hooks)",
        "task: t:b returned unknown key 'optimiser' (did you mean 'optimizer'?) (allowed: "
        "model, train_dataloader, val_dataloader, test_dataloader, optimizer, scheduler, "
        "criterion, metrics, hooks)",
        "task: t:b returned no 'model'",
    ]
    with pytest.raises(ConfigError, match="returned list"):
        check_task_result([], "t:b")


def test_writer_names_and_options_are_checked_with_the_rest(tmp_path):
    config = tmp_path / "c.yaml"
    (tmp_path / "task.py").write_text("def build():\n    return {}\n")
    config.write_text(
        "task: task.py:build\n"
        "runner: {writers: {tensorbord: {}, tensorboard: {sub_dir: tb}, jsonl: null}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load(config)
    assert str(info.value).splitlines() == [
        "runner.writers.tensorbord: unknown writer (did you mean 'tensorboard'?)",
        "runner.writers.tensorboard.sub_dir: unknown option (did you mean 'subdir'?) "
        "(options: subdir)",
    ]


def test_invalid_yaml_names_the_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("task: a.py:b\nrunner: {max_epochs: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3:1: invalid YAML"):
        load(bad)


def test_settings_rows_show_type_default_constraints_and_description():
    class S(PluginSettings):
        rate: float = Field(0.5, gt=0, le=1, description="How fast.")
        mode: Literal["a", "b"] = Field("a", description="Which.")
        names: list[str] | None = Field(None, min_length=1, description="Some names.")
        needed: int = Field(description="Must be given.")

    rows = {r["name"]: r for r in settings_rows(S)}
    assert rows["rate"] == {
        "name": "rate",
        "type": "float",
        "default": "0.5",
        "constraints": "> 0, <= 1",
        "description": "How fast.",
    }
    assert rows["mode"]["type"] == "a | b" and rows["mode"]["default"] == "a"
    assert rows["names"]["type"] == "list[str] | null"
    assert rows["names"]["constraints"] == "items >= 1"
    assert rows["needed"]["default"] == "required"


def test_schema_accepts_the_digits_config_and_rejects_a_bad_value():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from hookrun.config import schema
    from hookrun.discovery import installed_plugins

    config = yaml.safe_load(
        (Path(__file__).parent.parent / "examples/digits/config.yaml").read_text()
    )
    if not set(config["plugins"]) <= set(installed_plugins()):
        pytest.skip("the digits config names plugins that are not installed here")
    full = schema()
    jsonschema.validate(config, full)
    config["plugins"][next(iter(config["plugins"]))] = {"no_such_setting": 1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, full)

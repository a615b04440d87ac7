"""hookrun.config.file in-process: overrides, task loading, resolved config, settings rows."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from hookrun import PluginSettings
from hookrun.config.file import (
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
        "train_dataloader, val_dataloader, test_dataloader, predict_dataloader, optimizer, "
        "scheduler, criterion, metrics, hooks)",
        "task: t:b returned unknown key 'optimiser' (did you mean 'optimizer'?) (allowed: "
        "model, train_dataloader, val_dataloader, test_dataloader, predict_dataloader, "
        "optimizer, scheduler, criterion, metrics, hooks)",
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

    from hookrun.config.file import schema
    from hookrun.hooks.discovery import installed_plugins

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


def test_wrong_writer_shapes_are_config_errors(tmp_path):
    (tmp_path / "task.py").write_text("def build():\n    return {}\n")
    for writers, line in [
        ("{jsonl: 5}", "runner.writers.jsonl: expected a mapping of options, true or false "
         "(got 5)"),
        ("[1]", "runner.writers.0: expected a writer name (got 1)"),
        ("jsonl", "runner.writers: expected a list of writer names or a mapping of name to "
         "options (got 'jsonl')"),
    ]:  # fmt: skip
        config = tmp_path / "c.yaml"
        config.write_text(f"task: task.py:build\nrunner: {{writers: {writers}}}\n")
        with pytest.raises(ConfigError) as info:
            load(config)
        assert info.value.lines == [line]


def test_writers_may_be_switched_on_and_off_by_name(tmp_path):
    (tmp_path / "task.py").write_text("def build():\n    return {}\n")
    config = tmp_path / "c.yaml"
    config.write_text("task: task.py:build\nrunner: {writers: {jsonl: true, tensorboard: false}}\n")
    assert load(config).runner["writers"] == {"jsonl": True, "tensorboard": False}


def test_runner_section_has_the_new_arguments_with_defaults(tmp_path):
    (tmp_path / "task.py").write_text("def build():\n    return {}\n")
    config = tmp_path / "c.yaml"
    config.write_text("task: task.py:build\nrunner: {clip_grad: {max_norm: 1.0}}\n")
    runner = load(config).runner
    assert runner["log_interval"] == 10 and runner["strategy"] == "auto"
    assert runner["dist_timeout"] == 600 and runner["sync_bn"] is False
    assert runner["clip_grad"] == {"max_norm": 1.0, "norm_type": 2.0}


def test_runner_section_errors_match_the_runners_own(tmp_path):
    from hookrun.config.arguments import check_arguments

    bad = {
        "clip_grad": {"max_norm": 0, "nrom_type": 2},
        "seed": -1,
        "strategy": "dp",
        "dist_timeout": 0,
        "log_interval": 0,
        "max_epochs": 2,
        "max_iters": 3,
    }
    expected = [
        "runner.max_iters: give max_epochs or max_iters, not both (got 3)",
        "runner.seed: Input should be greater than or equal to 0 (got -1)",
        "runner.clip_grad.max_norm: Input should be greater than 0 (got 0)",
        "runner.clip_grad.nrom_type: unknown key (did you mean 'norm_type'?) "
        "(keys: max_norm, norm_type)",
        "runner.log_interval: Input should be greater than or equal to 1 (got 0)",
        "runner.strategy: Input should be 'auto', 'ddp' or 'fsdp' (got 'dp')",
        "runner.dist_timeout: Input should be greater than 0 (got 0)",
    ]
    with pytest.raises(ConfigError) as info:
        check_arguments(**bad)
    assert info.value.lines == expected
    (tmp_path / "task.py").write_text("def build():\n    return {}\n")
    config = tmp_path / "c.yaml"
    config.write_text("task: task.py:build\n")
    with pytest.raises(ConfigError) as info:
        load(config, [f"runner.{key}={value}" for key, value in bad.items()])
    assert info.value.lines == expected


def test_check_arguments_returns_the_validated_arguments(tmp_path):
    import torch

    from hookrun.config.arguments import check_arguments

    args = check_arguments(work_dir=tmp_path, device=torch.device("cpu"), clip_grad=0.5, seed=2)
    assert (args.work_dir, args.device, args.seed) == (str(tmp_path), "cpu", 2)
    assert args.clip_grad_norm == {"max_norm": 0.5}
    assert check_arguments().clip_grad_norm is None


@pytest.mark.parametrize("device", ["cuda:99", "meta", "gpu"])
def test_a_device_that_is_not_there_is_a_config_error(device):
    from hookrun.config.devices import resolve_device

    with pytest.raises(ConfigError, match=r"^runner\.device: .*\(got '" + device):
        resolve_device(device, 0)

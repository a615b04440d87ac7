"""The real ``hookrun`` console script in subprocesses: every command and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import DIGITS, clean_env, run, write
from hookrun.hooks.discovery import installed_plugins
from hookrun.hooks.dispatch import hook_points
from hookrun.testing import run_cli, write_toy_task


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A tiny config (only the checkpoint plugin) and its task file."""
    return write_toy_task(tmp_path)


# -- plugins -----------------------------------------------------------------------------


def test_plugins_list_json_rows_come_from_metadata():
    result = run("plugins", "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    expected = installed_plugins()
    assert [r["name"] for r in rows] == sorted(expected)
    for row in rows:
        assert set(row) == {"name", "distribution", "version", "entry_point"}
        assert row["distribution"] == expected[row["name"]].distribution
        assert row["entry_point"] == expected[row["name"]].value


def test_plugins_list_imports_no_torch_pydantic_pluggy_or_plugin():
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hookrun", "plugins", "list"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "click" in imported  # the parse works
    forbidden = {
        "torch",
        "pydantic",
        "pluggy",
        "numpy",
        *(f"hookrun_{n}" for n in installed_plugins()),
    }
    assert imported.isdisjoint(forbidden), imported & forbidden
    assert "timer" in result.stdout


def broken_plugins(site: Path) -> Path:
    """Two distributions whose plugin modules raise on import, on their own sys.path entry."""
    for name in ("broken", "blocked"):
        write(site / f"hookrun_{name}.py", "raise ImportError('missing dependency foo')\n")
        info = site / f"hookrun_{name}-2.0.dist-info"
        write(info / "METADATA", f"Metadata-Version: 2.1\nName: hookrun-{name}\nVersion: 2.0\n")
        write(info / "entry_points.txt", f"[hookrun.plugins]\n{name} = hookrun_{name}:X\n")
    return site


def test_plugins_list_load_adds_priority_hooks_and_load_errors(tmp_path):
    site = str(broken_plugins(tmp_path / "site"))
    result = run(
        "plugins", "list", "--json", "--load", PYTHONPATH=site, HOOKRUN_DISABLE_PLUGINS="blocked"
    )
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["broken"]["status"] == "error"
    assert rows["broken"]["distribution"] == "hookrun-broken"
    assert "ImportError: missing dependency foo" in rows["broken"]["error"]
    # a blocked plugin is never imported, so its import error never shows
    assert rows["blocked"]["status"] == "blocked by HOOKRUN_DISABLE_PLUGINS"
    assert rows["blocked"]["error"] is None
    order = hook_points()
    for name in installed_plugins():
        row = rows[name]
        assert row["status"] == "ok" and row["error"] is None
        assert isinstance(row["priority"], int) and isinstance(row["enabled_by_default"], bool)
        assert row["hooks"] and row["hooks"] == sorted(row["hooks"], key=order.index)
    if "timer" in rows:
        assert rows["timer"]["priority"] == 30 and "after_train_iter" in rows["timer"]["hooks"]

    text = run("plugins", "list", "--load", PYTHONPATH=site)
    assert text.returncode == 0
    assert "plugins in call order" in text.stdout
    assert "broken (hookrun-broken): failed to import" in text.stderr


def test_plugins_show_every_setting_and_unknown_name():
    name = sorted(installed_plugins())[0]
    result = run("plugins", "show", name, "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    cls = installed_plugins()[name].entry_point.load()
    assert [s["name"] for s in shown["settings"]] == list(cls.Settings.model_fields)
    assert all(s["description"] for s in shown["settings"])
    assert shown["priority"] == int(cls.priority)

    wrong = run("plugins", "show", name[:-1] + "x")
    assert wrong.returncode == 2
    assert f"did you mean {name!r}" in wrong.stderr
    assert "pip install" not in wrong.stderr  # a typo of an installed name: no install
    assert "Traceback" not in wrong.stderr


def test_plugins_new_writes_an_installable_package(tmp_path):
    result = run("plugins", "new", "my_counter", "--dir", tmp_path)
    assert result.returncode == 0, result.stderr
    pyproject = (tmp_path / "hookrun-my-counter" / "pyproject.toml").read_text()
    assert 'my_counter = "hookrun_my_counter:MyCounter"' in pyproject
    again = run("plugins", "new", "my_counter", "--dir", tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr
    bad = run("plugins", "new", "My-Plugin", "--dir", tmp_path)
    assert bad.returncode == 2 and "lowercase" in bad.stderr


# -- hooks and config --------------------------------------------------------------------


def test_hooks_prints_every_hook_point_with_arguments_and_docs():
    result = run("hooks", "--json")
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [e["name"] for e in entries] == hook_points()
    by_name = {e["name"]: e for e in entries}
    assert by_name["after_train_iter"]["arguments"] == ["runner", "batch_idx", "batch", "outputs"]
    assert all("Example" in e["doc"] for e in entries)
    text = run("hooks")
    assert "after_val_epoch(runner, metrics)" in text.stdout


def test_config_schema_includes_each_installed_plugin():
    result = run("config", "schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert set(schema["required"]) == {"task"}
    assert {"max_epochs", "work_dir", "seed", "amp"} <= set(
        schema["$defs"]["RunnerConfig"]["properties"]
    )
    plugins_ref = schema["properties"]["plugins"]["$ref"].rsplit("/", 1)[-1]
    plugins = schema["$defs"][plugins_ref]
    assert plugins["additionalProperties"] is False
    assert set(plugins["properties"]) == set(installed_plugins())
    for name, info in installed_plugins().items():
        options = plugins["properties"][name]["anyOf"]
        section = schema["$defs"][options[0]["$ref"].rsplit("/", 1)[-1]]
        fields = info.entry_point.load().Settings.model_fields
        assert set(section["properties"]) == {*fields, "priority"}
        assert {"type": "boolean"} in options


def test_config_validate_accepts_the_digits_config():
    result = run("config", "validate", DIGITS)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_five_mistakes_give_five_lines_and_exit_2(tmp_path):
    config = write(
        tmp_path / "bad.yaml",
        """
        task: missing_task.py:build
        runner: {max_epochs: 0, devcie: cpu}
        plugins:
          timer: {warmup: -3}
          ema: {decay: 1.5}
        """,
    )
    result = run("config", "validate", config)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 5, lines
    assert "plugins.ema.decay: Input should be less than 1 (got 1.5)" in lines
    assert "plugins.timer.warmup: Input should be greater than or equal to 0 (got -3)" in lines
    assert "runner.max_epochs: Input should be greater than or equal to 1 (got 0)" in lines
    assert "runner.devcie: unknown setting (did you mean 'device'?)" in lines
    assert any(line.startswith("task: file not found:") for line in lines)
    assert result.stdout == ""
    # train reports the same lines and starts nothing
    train = run("train", config, "--work-dir", tmp_path / "run")
    assert train.returncode == 2 and train.stderr.strip().splitlines() == lines
    assert not (tmp_path / "run").exists()


def test_unknown_plugin_and_key_get_did_you_mean(tmp_path):
    config = write(
        tmp_path / "typo.yaml",
        """
        task: x.py:build
        runer: {}
        plugins: {chekpoint: {interval: 2}, fancy_thing: true}
        """,
    )
    write(tmp_path / "x.py", "def build(): pass\n")
    # only the plugins the file names are imported: no torch import, a fast check
    result = run("config", "validate", config, HOOKRUN_PLUGINS_AUTOLOAD="0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert "runer: unknown setting (did you mean 'runner'?)" in lines
    assert "plugins.chekpoint: unknown plugin 'chekpoint' (did you mean 'checkpoint'?)" in lines
    assert (
        "plugins.fancy_thing: unknown plugin 'fancy_thing'; `hookrun plugins list` shows the "
        "installed plugins" in lines
    )


def test_set_values_are_yaml_and_validated(toy):
    bad = run(
        "config",
        "validate",
        toy,
        "--set",
        "runner.max_epochs=many",
        "--set",
        "plugins.checkpoint.max_keep=0",
        "--set",
        "nodots",
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert "--set nodots: expected KEY=VALUE with a dotted KEY (a.b=1)" in lines
    assert any(line.startswith("runner.max_epochs:") and "(got 'many')" in line for line in lines)
    assert any(line.startswith("plugins.checkpoint.max_keep:") for line in lines)
    assert len(lines) == 3


def test_usage_errors_exit_2_without_traceback(tmp_path):
    stderr = {}
    for args in (
        ["no-such-command"],
        ["train"],
        ["train", tmp_path / "nope.yaml"],
        ["val", tmp_path / "nope.yaml"],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr
        stderr[args[0], len(args)] = result.stderr
    assert stderr["train", 2].strip() == f"{tmp_path / 'nope.yaml'}: config file not found"


def test_a_usage_error_is_one_line_naming_the_command(tmp_path):
    """click's Usage / Try / blank / Error lines become one, keeping its message and its
    suggestion; nothing is created."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    write(tmp_path / "c.yaml", "task: x.py:build\n")
    cases = {
        ("train", "adir"): "hookrun train: invalid value for 'CONFIG': File 'adir' is a directory",
        ("train", "c.yaml", "--work-dir", "afile"): (
            "hookrun train: invalid value for '--work-dir': Directory 'afile' is a file"
        ),
        ("train", "c.yaml", "--resum", "auto"): (
            "hookrun train: no such option '--resum' (did you mean '--resume'?)"
        ),
        ("plugins", "lst"): "hookrun plugins: no such command 'lst' (did you mean 'list'?)",
        ("train", "c.yaml", "--set"): "hookrun train: option '--set' requires an argument",
        ("train",): "hookrun train: missing argument 'CONFIG'",
        ("nope",): "hookrun: no such command 'nope'",
    }
    before = set(tmp_path.rglob("*"))
    for args, line in cases.items():
        result = run(*args, cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n"), args
    assert set(tmp_path.rglob("*")) == before
    group = run("plugins")  # a group without its command still shows its help
    assert group.returncode == 2 and "Commands:" in group.stderr and "list" in group.stderr
    helped = run("train", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: hookrun train [OPTIONS]")


def test_every_rank_prints_its_own_error_prefixed(tmp_path):
    result = run("config", "validate", tmp_path / "nope.yaml", RANK="1", WORLD_SIZE="2")
    assert result.returncode == 2
    assert result.stderr == f"[rank 1] {tmp_path / 'nope.yaml'}: config file not found\n"


def test_python_m_hookrun_is_the_same_cli():
    result = subprocess.run(
        [sys.executable, "-m", "hookrun", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "0.1.0" in result.stdout


# -- train, val, test with a tiny task ---------------------------------------------------


def test_train_test_and_resume_exit_codes(toy, tmp_path, capsys):
    work = tmp_path / "run"
    first = run("train", toy, "--work-dir", work)
    assert first.returncode == 0, first.stderr
    assert "final metrics" in first.stdout
    assert first.stdout.startswith("[hookrun] building task toytask.py:build ...\n")
    assert f"JSONL log:    {work / 'log.jsonl'}" in first.stdout
    assert "tensorboard" not in first.stdout  # only the writers that ran ([jsonl]) are listed
    saved = (work / "config.yaml").read_text()
    assert f"work_dir: {work.resolve()}" in saved and "toytask.py:build" in saved
    checkpoint = work / "checkpoints" / "epoch_2.pt"
    assert checkpoint.is_file()

    code, _, err = run_cli(capsys, "train", toy, "--work-dir", work)  # messages: in-process
    assert code == 2
    assert "already holds a run" in err and "--resume auto" in err

    more = run(
        "train",
        toy,
        "--work-dir",
        work,
        "--resume",
        "auto",
        "--set",
        "runner.max_epochs=3",
        "--set",
        "plugins.checkpoint.max_keep=1",
    )
    assert more.returncode == 0, more.stderr
    assert "resumed from" in more.stdout
    kept = {p.name for p in (work / "checkpoints").glob("epoch_*.pt")}
    assert "epoch_3.pt" in kept and "epoch_1.pt" not in kept  # the --set max_keep=1 took effect

    code, out, err = run_cli(capsys, "val", toy, "--checkpoint", checkpoint, "--work-dir", work)
    assert code == 0, err
    assert "accuracy" in out
    code, _, err = run_cli(capsys, "test", toy, "--checkpoint", work / "nope.pt")
    assert code == 2 and "--checkpoint: file not found" in err
    code, out, err = run_cli(capsys, "test", toy, "--work-dir", work)  # the run's latest
    assert code == 0, err
    assert f"[hookrun] evaluating {work / 'checkpoints' / 'epoch_3.pt'}" in out
    code, _, err = run_cli(capsys, "val", toy, "--work-dir", tmp_path / "empty")
    assert (code, err.splitlines()[-1]) == (
        2,
        f"--checkpoint: none given and {tmp_path / 'empty' / 'checkpoints'} holds no "
        "checkpoint; give --checkpoint PATH",
    )
    assert not (tmp_path / "empty").exists()


def test_failure_in_user_code_exits_1_with_its_traceback(toy, tmp_path):
    result = run(
        "train", toy, "--work-dir", tmp_path / "run", "--set", "task_args.fail_in_forward=true"
    )
    assert result.returncode == 1
    assert "training failed" in result.stderr
    assert (
        "toytask.py" in result.stderr
        and 'raise ValueError("user code broke here")' in result.stderr
    )
    assert "click" not in result.stderr


def test_task_returning_wrong_keys_is_a_config_error(toy, tmp_path, capsys):
    work = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "train", toy, "--work-dir", work, "--set", "task=toytask.py:wrong_keys"
    )
    assert code == 2
    assert "returned unknown key 'modle' (did you mean 'model'?)" in err
    assert "returned no 'model'" in err


def test_help_shows_whole_summaries_an_example_and_the_docs(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    commands = out[out.index("Commands:") : out.index("Example:")]
    text = " ".join(commands.split())
    for line in (
        "val Evaluate a checkpoint (default: the run's latest) on the task's val_dataloader.",
        "schedule The learning rate (and momentum) over the whole run of CONFIG, without training.",
    ):
        assert line in text
    assert "..." not in commands  # no summary is cut
    assert "hookrun train examples/digits/config.yaml --work-dir runs/digits" in out
    assert "Docs: https://github.com/hookrun/hookrun/tree/main/docs" in out

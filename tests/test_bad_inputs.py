"""Bad input in config files and command-line arguments (issues 29 and 30): YAML bombs, NaN
and infinities, files that are not UTF-8, duplicate keys, names no file system takes, `~`,
output paths below a file. Each ends the real ``hookrun`` command with one line naming the
file or setting, exit code 2, no traceback, nothing created, each problem reported once."""

from __future__ import annotations

import math
import os
import resource
import shutil
import subprocess
import sys
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel

from _support import errors_of
from hookrun.config import file as cfg
from hookrun.config.arguments import RunnerArguments
from hookrun.engine.runner import Runner
from hookrun.errors import ConfigError
from hookrun.hooks.discovery import installed_plugins
from hookrun.testing import forked, toy_runner_kwargs, write_toy_task

LONG_NAME = "n" * 256  # one byte over what ext4, XFS, Btrfs and APFS take


def hookrun_script() -> str:
    """The console script installed next to this interpreter."""
    beside = Path(sys.executable).parent / "hookrun"
    return str(beside) if beside.exists() else shutil.which("hookrun") or "hookrun"


def isolated(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKRUN_") and k != "RANK"}
    return {**env, "HOOKRUN_PLUGINS_AUTOLOAD": "0", **extra}


def hookrun(*args: object, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return forked.run(
        [hookrun_script(), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=isolated(**env),
        timeout=120,  # a command that waits on a FIFO fails here instead of hanging
    )


def refused(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines on stderr of a command refused as a user's mistake (exit 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result.stderr.splitlines()


def listing(folder: Path) -> set[Path]:
    """Every path under ``folder`` but Python's bytecode cache (a task module imported)."""
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """The toy task and a config of it whose work dir is ``tmp_path/run``."""
    return write_toy_task(
        tmp_path,
        "task: toytask.py:build\n"
        "runner: {max_epochs: 1, device: cpu, writers: [jsonl], work_dir: run}\n"
        "plugins: {checkpoint: true}\n",
    )


# -- YAML bombs -----------------------------------------------------------------------------


def billion_laughs() -> str:
    """Nine levels of nine aliases: 0.6 KB of YAML standing for 9⁹ (387 million) strings."""
    lines = [
        "task: toytask.py:build",
        "task_args:",
        '  a: &a ["lol",' + ",".join(['"lol"'] * 8) + "]",
    ]
    names = "abcdefghi"
    for previous, name in zip(names, names[1:], strict=False):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


BOMBS = {
    "billion_laughs": (billion_laughs(), "aliases stand for more than 100,000 values"),
    "merge_keys": (  # `<<` merges doubling at every level
        "task: toytask.py:build\ntask_args:\n  l0: &l0 {a: 1, b: 2}\n"
        + "".join(
            f"  l{i}: &l{i} {{<<: [*l{i - 1}, *l{i - 1}], k{i}: [*l{i - 1}, *l{i - 1}]}}\n"
            for i in range(1, 40)
        ),
        "aliases stand for more than 100,000 values",
    ),
    "flow_5000_deep": (
        "task: toytask.py:build\ntask_args: {x: " + "[" * 5000 + "]" * 5000 + "}\n",
        "nested deeper than 100 levels",
    ),
    "block_5000_deep": (
        "task: toytask.py:build\ntask_args:\n"
        + "".join(f"{' ' * (i + 1)}k:\n" for i in range(5000))
        + " " * 5001
        + "x: 1\n",
        "nested deeper than 100 levels",
    ),
}


def run_measured(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """``hookrun ARGS``: the result, its wall time in seconds and its peak RSS in bytes (its
    own, read with ``wait4``), under a 3 GB address-space and 30 s CPU limit so that a bomb
    that is not refused ends here rather than taking the machine."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (30, 30))

    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    start = time.perf_counter()
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = forked.spawn(
            [hookrun_script(), *args],
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=isolated(),
            preexec_fn=limits,
        )
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = subprocess.CompletedProcess(args, proc.returncode, out.read_text(), err.read_text())
    return result, wall, usage.ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_yaml_bomb_is_one_line_in_bounded_memory(toy, tmp_path, bomb):
    text, problem = BOMBS[bomb]
    (tmp_path / "bomb.yaml").write_text(text)
    result, _, peak = run_measured(["config", "validate", "bomb.yaml"], tmp_path)
    [line] = refused(result)
    assert line.startswith("bomb.yaml:") and problem in line, line
    assert peak < 500 * 2**20, f"{peak / 2**20:.0f} MB"


@pytest.mark.timing
def test_yaml_bombs_are_refused_within_seconds(toy, tmp_path):
    for bomb, (text, problem) in BOMBS.items():
        (tmp_path / f"{bomb}.yaml").write_text(text)
        result, wall, _ = run_measured(["config", "validate", f"{bomb}.yaml"], tmp_path)
        assert problem in refused(result)[0]
        assert wall < 5, (bomb, wall)


def test_a_bomb_in_a_set_value_and_a_self_alias_are_one_line(toy, tmp_path):
    deep = "[" * 200 + "]" * 200
    assert refused(
        hookrun("config", "validate", toy, "--set", f"task_args.x={deep}", cwd=tmp_path)
    ) == ["--set task_args.x: nested deeper than 100 levels"]
    (tmp_path / "loop.yaml").write_text("task: toytask.py:build\ntask_args: {x: &x [1, *x]}\n")
    assert errors_of(tmp_path / "loop.yaml") == [
        f"{tmp_path / 'loop.yaml'}:2:23: alias *x is used inside the value it names"
    ]


def test_aliases_and_merge_keys_within_the_bound_still_work(toy, tmp_path):
    """A key merged in with ``<<`` and given again is an override, not a duplicate."""
    (tmp_path / "merged.yaml").write_text(
        "task: toytask.py:build\n"
        "task_args: {<<: {n: 16, width: 3}, n: &n 32}\n"
        "runner: {max_epochs: 1, device: cpu, writers: [jsonl], log_interval: *n}\n"
    )
    loaded = cfg.load(tmp_path / "merged.yaml")
    assert loaded.data["task_args"] == {"n": 32, "width": 3}
    assert loaded.runner["log_interval"] == 32


# -- NaN and infinities ---------------------------------------------------------------------


def float_paths(model: type[BaseModel], prefix: str) -> list[str]:
    """Dotted paths of every float setting of ``model`` and the models inside it."""
    paths = []
    for name, field in model.model_fields.items():
        kinds = flatten(field.annotation)
        if float in kinds:
            paths.append(f"{prefix}.{name}")
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                paths += float_paths(kind, f"{prefix}.{name}")
    return paths


def flatten(annotation: Any) -> list[Any]:
    """The types an annotation is made of (through unions, Optional, Annotated, lists)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return flatten(args[0])
    return [t for arg in args for t in flatten(arg)] if args else [annotation]


def every_float_setting() -> list[str]:
    """The core's float settings (runner, clip_grad, the schedule) and every installed
    plugin's, found from the models, not listed by hand."""
    paths = float_paths(cfg.Config, "")
    for name, info in sorted(installed_plugins().items()):
        paths += float_paths(info.entry_point.load().Settings, f"plugins.{name}")
    return [p.lstrip(".") for p in paths]


#: Keywords of the optimizer and the scheduler (free-form, checked as numbers wherever they
#: are): the path in the line, and the override that puts the value ``{}`` there.
KEYWORDS = {
    "optimizer.lr": "optimizer.lr={}",
    "optimizer.momentum": "optimizer.momentum={}",
    "optimizer.param_groups.0.lr": "optimizer.param_groups=[{{params: '*', lr: {}}}]",
    "scheduler.main.gamma": "scheduler.main.gamma={}",
}

#: A non-finite value a setting documents: clip_grad_norm_'s max norm.
DOCUMENTED = {("runner.clip_grad.norm_type", math.inf)}


def test_the_float_settings_are_found_in_the_models():
    found = every_float_setting()
    assert {
        "runner.dist_timeout",
        "runner.clip_grad",
        "runner.clip_grad.max_norm",
        "runner.clip_grad.norm_type",
        "scheduler.warmup.start_factor",
        "plugins.ema.decay",
        "plugins.early_stopping.min_delta",
        "plugins.logger.refresh_per_second",
    } <= set(found)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_nan_and_inf_are_refused_in_every_float_setting(tmp_path, value):
    toy = write_toy_task(
        tmp_path,
        "task: toytask.py:build\n"
        "task_args: {optimizer: false}\n"
        "runner: {max_epochs: 3, device: cpu, writers: [jsonl], clip_grad: {max_norm: 1.0}}\n"
        "optimizer: {type: SGD, lr: 0.1, param_groups: [{params: '*', lr: 0.1}]}\n"
        "scheduler: {main: {type: StepLR, step_size: 1}, warmup: {epochs: 1}}\n",
    )
    cfg.load(toy)  # the base config is valid
    text = {math.nan: ".nan", math.inf: ".inf", -math.inf: "-.inf"}[value]
    overrides = {path: f"{path}={{}}" for path in every_float_setting()} | KEYWORDS
    for path, override in overrides.items():
        try:
            cfg.load(toy, [override.format(text)])
        except ConfigError as exc:
            lines = exc.lines
        else:
            lines = []
        if (path, value) in DOCUMENTED:
            assert lines == [], (path, lines)
            continue
        assert len(lines) == 1, (path, lines)
        assert lines[0].startswith(f"{path}: Input should be a finite number"), lines
        assert lines[0].endswith(f"(got {value!r})"), lines


def test_clip_grad_nan_is_refused_by_the_cli_and_the_runner(toy, tmp_path):
    result = hookrun(
        "config",
        "validate",
        toy,
        "--set",
        "runner.clip_grad={max_norm: 1.0, norm_type: .nan}",
        cwd=tmp_path,
    )
    assert refused(result) == [
        "runner.clip_grad.norm_type: Input should be a finite number or inf (got nan)"
    ]
    with pytest.raises(ConfigError) as caught:
        Runner(**toy_runner_kwargs(tmp_path, clip_grad={"max_norm": 1.0, "norm_type": math.nan}))
    assert caught.value.lines == [
        "runner.clip_grad.norm_type: Input should be a finite number or inf (got nan)"
    ]
    with pytest.raises(ConfigError, match=r"^runner.dist_timeout: Input should be a finite"):
        Runner(**toy_runner_kwargs(tmp_path, dist_timeout=math.inf))
    assert not (tmp_path / "run").exists()
    # inf is torch's max norm, as documented
    assert RunnerArguments(clip_grad={"max_norm": 1.0, "norm_type": math.inf}).clip_grad_norm == {
        "max_norm": 1.0,
        "norm_type": math.inf,
    }


# -- the config file itself -----------------------------------------------------------------

TASK = b"task: toytask.py:build\n"
RUNNER = b"runner: {max_epochs: 1, device: cpu, writers: [jsonl], work_dir: run}\n"

FILE_MISTAKES = {
    "latin1": (
        TASK + RUNNER + b"task_args: {name: caf\xe9}\n",
        "bad.yaml:3: not UTF-8 text (byte 0xe9); save the file as UTF-8",
    ),
    "utf16": (
        "task: toytask.py:build\n".encode("utf-16"),
        "bad.yaml:1: not UTF-8 text (byte 0xff); save the file as UTF-8",
    ),
    "control_character": (
        TASK + RUNNER + b"task_args: {x: \x07}\n",
        "bad.yaml:3: invalid YAML: control character #x0007 is not allowed",
    ),
    "duplicate_top_level": (
        TASK + b"runner: {max_epochs: 1}\n" + RUNNER,
        "bad.yaml:3:1: duplicate key 'runner' (first at line 2); give each key once",
    ),
    "duplicate_nested": (
        TASK + b"runner:\n  device: cpu\n  work_dir: run\n  seed: 1\n  seed: 2\n",
        "bad.yaml:6:3: duplicate key 'seed' (first at line 5); give each key once",
    ),
    "duplicate_in_a_plugin": (
        TASK + RUNNER + b"plugins:\n  checkpoint: {interval: 1, interval: 2}\n",
        "bad.yaml:4:29: duplicate key 'interval' (first at line 4); give each key once",
    ),
}


@pytest.mark.parametrize("mistake", list(FILE_MISTAKES))
def test_a_config_file_mistake_is_one_line_naming_the_file_and_line(toy, tmp_path, mistake):
    content, line = FILE_MISTAKES[mistake]
    (tmp_path / "bad.yaml").write_bytes(content)
    assert refused(hookrun("config", "validate", "bad.yaml", cwd=tmp_path)) == [line]


def test_a_config_that_is_a_fifo_is_one_line_not_a_hang(toy, tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    assert refused(hookrun("config", "validate", "pipe.yaml", cwd=tmp_path)) == [
        "pipe.yaml: not a regular file; name the config file"
    ]


def test_train_refuses_a_duplicate_key_and_creates_nothing(toy, tmp_path):
    content, line = FILE_MISTAKES["duplicate_top_level"]
    (tmp_path / "bad.yaml").write_bytes(content)
    before = listing(tmp_path)
    assert refused(hookrun("train", "bad.yaml", cwd=tmp_path)) == [line]
    assert listing(tmp_path) == before


def test_a_refused_value_is_not_cross_checked_again(toy, tmp_path):
    """An invalid ``runner.scheduler_interval`` is one line; the check that it agrees with
    ``scheduler.interval`` runs only on valid values (and still runs on them)."""
    schedule = "scheduler={main: {type: StepLR, step_size: 1}, interval: iter}"
    interval = "runner.scheduler_interval"
    result = hookrun(
        "config", "validate", toy, "--set", schedule, "--set", f"{interval}=batch", cwd=tmp_path
    )
    assert refused(result) == [f"{interval}: Input should be 'epoch' or 'iter' (got 'batch')"]
    assert errors_of(toy, schedule, f"{interval}=epoch") == [
        f"scheduler.interval: 'iter' contradicts {interval} 'epoch'; keep one of them"
    ]
    assert errors_of(toy, "task=toytask.py:build:x") == [
        "task: expected 'module:callable' or 'path/to/file.py:callable' (got 'toytask.py:build:x')"
    ]


def test_train_reports_each_of_several_mistakes_once_and_creates_nothing(toy, tmp_path):
    before = listing(tmp_path)
    result = hookrun(
        "train",
        toy,
        "--set",
        "runner.clip_grad={max_norm: .inf}",
        "--set",
        "runner.scheduler_interval=batch",
        "--set",
        "scheduler={main: {type: StepLR, step_size: 1}, interval: iter}",
        "--set",
        f"runner.work_dir=runs/{LONG_NAME}",
        cwd=tmp_path,
    )
    assert sorted(refused(result)) == [
        "runner.clip_grad.max_norm: Input should be a finite number (got inf)",
        "runner.scheduler_interval: Input should be 'epoch' or 'iter' (got 'batch')",
        "runner.work_dir: a name in the path is 256 bytes long; file systems take at most 255 "
        f"(got 'runs/{LONG_NAME}')",
    ]
    assert listing(tmp_path) == before


# -- paths ----------------------------------------------------------------------------------


def test_a_name_too_long_is_one_line_and_nothing_is_created(toy, tmp_path):
    before = listing(tmp_path)
    too_long = "a name in the path is 256 bytes long; file systems take at most 255"
    assert errors_of(toy, f"runner.work_dir={LONG_NAME}/x") == [
        f"runner.work_dir: {too_long} (got '{LONG_NAME}/x')"
    ]
    result = hookrun("train", toy, "--work-dir", f"runs/{LONG_NAME}", cwd=tmp_path)
    assert refused(result) == [f"runner.work_dir: {too_long} (got 'runs/{LONG_NAME}')"]
    result = hookrun("train", toy, "--resume", f"{LONG_NAME}/ck.pt", cwd=tmp_path)
    assert refused(result) == [f"--resume: {too_long} (got '{LONG_NAME}/ck.pt')"]
    result = hookrun("config", "validate", f"{LONG_NAME}/c.yaml", cwd=tmp_path)
    assert refused(result) == [f"CONFIG: {too_long} (got '{LONG_NAME}/c.yaml')"]
    assert listing(tmp_path) == before


def test_an_empty_path_option_is_one_line_naming_it_and_nothing_is_created(toy, tmp_path):
    """Click makes ``''`` the current folder: ``--work-dir ''`` trained into it, while
    ``runner.work_dir: ''`` in the file is refused."""
    before = listing(tmp_path)
    for args, line in (
        (("train", toy, "--work-dir", ""), "--work-dir: give a folder (got '')"),
        (("train", toy, "--work-dir", " "), "--work-dir: give a folder (got ' ')"),
        (("train", toy, "--resume", ""), "--resume: give auto or a checkpoint file (got '')"),
        (("test", toy, "--checkpoint", ""), "--checkpoint: give a checkpoint file (got '')"),
        (("config", "validate", ""), "CONFIG: give a file (got '')"),
        (("export", "", "out.pt"), "CHECKPOINT: give a path (got '')"),
        (
            ("predict", toy, "--checkpoint", "", "--output", "p.pt"),
            "--checkpoint: give a checkpoint file (got '')",
        ),
    ):
        assert refused(hookrun(*args, cwd=tmp_path)) == [line], args
    assert listing(tmp_path) == before
    assert errors_of(toy, "runner.work_dir=''") == ["runner.work_dir: give a folder (got '')"]


def test_a_tilde_work_dir_is_the_home_folder_in_every_line_and_write(tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    toy = write_toy_task(
        cwd,
        "task: toytask.py:build\n"
        "runner: {max_epochs: 1, device: cpu, writers: [jsonl], work_dir: ~/runs/exp}\n"
        "plugins: {checkpoint: true}\n",
    )
    result = hookrun("train", toy, cwd=cwd, HOME=str(home))
    assert result.returncode == 0, result.stderr
    out = home / "runs" / "exp"
    assert (out / "log.jsonl").is_file() and (out / "checkpoints" / "epoch_1.pt").is_file()
    assert not (cwd / "~").exists()
    assert str(out) in result.stdout and "~/runs" not in result.stdout + result.stderr
    saved = cfg.load(out / "config.yaml")
    assert saved.runner["work_dir"] == str(out)
    # the check looks where the run writes: a file there is named by its full path
    (home / "taken").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    assert errors_of(toy, "runner.work_dir=~/taken/exp") == [
        f"runner.work_dir: cannot create {home}/taken/exp: {home}/taken is a file, not a folder"
    ]


def test_the_runner_expands_a_tilde_work_dir_as_the_config_does(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    runner = Runner(**toy_runner_kwargs(tmp_path, work_dir="~/runs/api"))
    assert runner.work_dir == tmp_path / "home" / "runs" / "api"


# -- output paths ---------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A real checkpoint of the toy run."""
    runner = Runner(**toy_runner_kwargs(tmp_path / "trained", max_epochs=1))
    runner.train()
    path = tmp_path / "ck.pt"
    runner.save_checkpoint(path)
    return path


def test_export_below_a_regular_file_is_one_line(checkpoint, tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = hookrun("export", checkpoint, "results.csv/model.pt", cwd=tmp_path)
    assert refused(result) == [
        "OUT: cannot create results.csv/model.pt: results.csv is a file, not a folder"
    ]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    result = hookrun("export", checkpoint, f"out/{LONG_NAME}.pt", cwd=tmp_path)
    assert refused(result) == [
        f"OUT: a name in the path is 259 bytes long; file systems take at most 255 "
        f"(got 'out/{LONG_NAME}.pt')"
    ]
    result = hookrun("export", checkpoint, "exported/model.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    weights = torch.load(tmp_path / "exported" / "model.pt", weights_only=True)
    assert set(weights) == set(torch.load(checkpoint, weights_only=True)["model"])


def test_other_output_paths_below_a_regular_file_are_one_line(toy, tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n")
    before = listing(tmp_path)
    result = hookrun("schedule", toy, "--plot", "results.csv/lr.png", cwd=tmp_path)
    assert refused(result) == [
        "--plot: cannot create results.csv/lr.png: results.csv is a file, not a folder"
    ]
    result = hookrun("plugins", "new", "mine", "--dir", "results.csv/plugins", cwd=tmp_path)
    assert refused(result) == [
        "--dir: cannot create results.csv/plugins: results.csv is a file, not a folder"
    ]
    assert listing(tmp_path) == before


# -- the task module ------------------------------------------------------------------------

#: The config of a task file ``broken.py`` written by each test, its work dir two new folders.
BROKEN = (
    "task: broken.py:build\n"
    "runner: {max_epochs: 1, device: cpu, writers: [jsonl], work_dir: runs/exp}\n"
    "plugins: {checkpoint: true}\n"
)


@pytest.mark.parametrize(
    ("source", "where"),
    [
        ("import os\n\ndef build(:\n    pass\n", "3:11: SyntaxError: invalid syntax"),
        ("def build():\n    pass\nreturn 1\n", "3:1: SyntaxError: 'return' outside function"),
        ("def build():\n  x = 1\n    y = 2\n", "3:4: IndentationError: unexpected indent"),
    ],
    ids=["parse", "compile", "indent"],
)
def test_a_task_file_that_does_not_compile_is_one_line_in_validate_and_train(
    tmp_path, source, where
):
    (tmp_path / "broken.py").write_text(source)
    (tmp_path / "c.yaml").write_text(BROKEN)
    line = f"task: {tmp_path / 'broken.py'}:{where}"
    before = listing(tmp_path)
    assert refused(hookrun("config", "validate", "c.yaml", cwd=tmp_path)) == [line]
    assert refused(hookrun("train", "c.yaml", cwd=tmp_path)) == [line]
    assert listing(tmp_path) == before


def test_validate_compiles_the_task_without_running_it(tmp_path):
    """A valid task file is compiled only: its top level never runs, and a SyntaxWarning
    (an invalid escape) is no error and prints nothing."""
    (tmp_path / "broken.py").write_text(
        "open('ran', 'w').close()\nPATTERN = '\\d'\n\ndef build():\n    pass\n"
    )
    (tmp_path / "c.yaml").write_text(BROKEN)
    result = hookrun("config", "validate", "c.yaml", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert not (tmp_path / "ran").exists()


FAILING_TASKS = {
    "raises": ("def build():\n    raise RuntimeError('data folder missing')\n", 1),
    "bad_import": ("import no_such_package_here\n\ndef build():\n    pass\n", 1),
    "type_error": ("def build(width=2):\n    return {'model': '%d' % (width,) % 2}\n", 1),
    "ctrl_c": (  # Ctrl-C while the task builds
        "import os, signal\n\ndef build():\n    os.kill(os.getpid(), signal.SIGINT)\n",
        130,
    ),
}


@pytest.mark.parametrize("failure", list(FAILING_TASKS))
def test_a_task_failing_while_it_builds_leaves_no_work_dir(tmp_path, failure):
    """The user's traceback (their bug), or `interrupted` after Ctrl-C; the work dir the
    lock created (two new folders) is removed, and one that existed keeps only what it had."""
    source, code = FAILING_TASKS[failure]
    (tmp_path / "broken.py").write_text(source)
    (tmp_path / "c.yaml").write_text(BROKEN)
    before = listing(tmp_path)
    result = hookrun("train", "c.yaml", cwd=tmp_path)
    assert result.returncode == code, result.stderr
    if code == 1:
        assert "hookrun: training failed:" in result.stderr
        assert 'broken.py", line' in result.stderr  # the traceback reaches the user's line
    else:
        assert result.stderr.splitlines()[-1] == "interrupted"
    assert listing(tmp_path) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    (tmp_path / "c.yaml").write_text(BROKEN.replace("runs/exp", "mine"))
    assert hookrun("train", "c.yaml", cwd=tmp_path).returncode == code
    assert listing(mine) == {mine / "notes.txt"}
    assert (mine / "notes.txt").read_text() == "my notes"

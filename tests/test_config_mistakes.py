"""Every mistake a config can hold is found by validation, before any work: one line with
its dotted path, exit 2 from the CLI, no traceback, nothing created on disk. A seeded fuzz
of the digits example config checks that no mutation ends any other way."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from _support import errors_of, run
from hookrun.config import file as cfg
from hookrun.testing import run_cli, write_toy_task

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits" / "config.yaml"

pytestmark = pytest.mark.usefixtures("hookrun_isolated")


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write_toy_task(tmp_path)


# -- the listed mistakes, in-process -------------------------------------------------------


def test_task_args_are_checked_against_the_task_signature(toy):
    assert errors_of(toy, "task_args.widht=3", "task_args.n=8") == [
        "task_args.widht: toytask.py:build takes no argument 'widht' (did you mean 'width'?) "
        "(arguments: n, width, optimizer, pause_dir, fail_in_forward)"
    ]
    (toy.parent / "needs.py").write_text(
        "def build(size, *, depth, scale=1.0, **extra):\n    return {}\n"
    )
    # **extra takes any key; size and depth have no default
    assert errors_of(toy, "task=needs.py:build", "task_args.whatever=1") == [
        "task_args.size: required by needs.py:build and missing",
        "task_args.depth: required by needs.py:build and missing",
    ]


def test_a_module_task_is_read_from_its_source_without_importing_it(toy, monkeypatch):
    (toy.parent / "side_effect_task.py").write_text(
        "open('IMPORTED', 'w').close()\n\ndef build(batch_size=64):\n    return {}\n"
    )
    monkeypatch.chdir(toy.parent)
    assert errors_of(toy, "task=side_effect_task:build", "task_args.batchsize=3") == [
        "task_args.batchsize: side_effect_task:build takes no argument 'batchsize' "
        "(did you mean 'batch_size'?) (arguments: batch_size)"
    ]
    assert not (toy.parent / "IMPORTED").exists()


def test_a_task_callable_the_source_does_not_define_is_one_line_before_any_import(
    toy, monkeypatch, capsys
):
    """The name is looked up in the task's source (file or module), as the import would
    report it, without running the module; a module that may bind names its source does
    not show (a star import, ``globals()``, a module ``__getattr__``) is left to the import."""
    source = "open('IMPORTED', 'w').close()\n\nif True:\n    def build():\n        return {}\n"
    (toy.parent / "typo_task.py").write_text(source)
    monkeypatch.chdir(toy.parent)
    file = toy.parent / "typo_task.py"
    assert errors_of(toy, "task=typo_task.py:biuld") == [
        f"task: {file} has no 'biuld' (did you mean 'build'?)"
    ]
    assert errors_of(toy, "task=typo_task:biuld") == [
        "task: typo_task has no 'biuld' (did you mean 'build'?)"
    ]
    assert errors_of(toy, "task=typo_task.py:build") == []  # bound inside the `if`
    assert not (toy.parent / "IMPORTED").exists()
    for dynamic in ("from os.path import *\n", "globals()['biuld'] = print\n"):
        (toy.parent / "dynamic_task.py").write_text(dynamic + source)
        assert errors_of(toy, "task=dynamic_task.py:biuld") == []
    work = toy.parent / "never"
    code, _, err = run_cli(
        capsys, "train", toy, "--work-dir", work, "--set", "task=typo_task.py:biuld"
    )
    assert (code, err) == (2, f"task: {file} has no 'biuld' (did you mean 'build'?)\n")
    assert not work.exists() and not (toy.parent / "IMPORTED").exists()


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "runner.device=meta",
            "runner.device: 'meta' tensors hold no data, nothing can train "
            "on them (got 'meta'); use auto or cpu",
        ),
        (
            "runner.seed=100000000000000000000",
            "runner.seed: Input should be less than "
            "18446744073709551616 (got 100000000000000000000)",
        ),
        (
            "runner.clip_grad={max_norm: 1, nrom_type: 2}",
            "runner.clip_grad.nrom_type: unknown "
            "key (did you mean 'norm_type'?) (keys: max_norm, norm_type)",
        ),
        (
            "plugins.precise_bn.num_batches=1000000000000000000000",
            "plugins.precise_bn."
            "num_batches: 1000000000000000000000 is beyond the 64-bit integers torch and Python's"
            " C code take (at most 9223372036854775807)",
        ),
        (
            'runner.work_dir="runs/a\\0b"',
            "runner.work_dir: a path cannot hold a NUL byte (got 'runs/a\\x00b')",
        ),
        (
            "runner.writers={jsonl: 5}",
            "runner.writers.jsonl: expected a mapping of options, true or false (got 5)",
        ),
        ("runner.writers=[1]", "runner.writers.0: expected a writer name (got 1)"),
        (
            "runner.grad_accum=1000000000000000000000",
            "runner.grad_accum: Input should be less than or equal to 9223372036854775807 "
            "(got 1000000000000000000000)",
        ),
    ],
)
def test_each_listed_mistake_is_one_line_with_its_path(toy, override, line):
    assert errors_of(toy, override) == [line]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_cuda_without_cuda_is_a_config_error(toy):
    assert errors_of(toy, "runner.device=cuda:1") == [
        "runner.device: CUDA is not available here (got 'cuda:1'); use auto or cpu"
    ]


def test_the_work_dirs_place_is_checked_without_creating_it(toy):
    a_file = toy.parent / "a_file"
    a_file.write_text("x")
    assert errors_of(toy, f"runner.work_dir={a_file}/run/sub") == [
        f"runner.work_dir: cannot create {a_file}/run/sub: {a_file} is a file, not a folder"
    ]
    assert errors_of(toy, f"runner.work_dir={a_file}") == [
        f"runner.work_dir: {a_file} exists and is not a folder"
    ]
    assert not (toy.parent / "runs").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_folder_without_write_permission_is_a_config_error(toy):
    locked = toy.parent / "locked"
    locked.mkdir(mode=0o555)
    assert errors_of(toy, f"runner.work_dir={locked}/run") == [
        f"runner.work_dir: cannot write in {locked}: permission denied"
    ]


@pytest.mark.parametrize(
    ("flag", "free", "problem"),
    [(os.ST_RDONLY, 2**30, "read-only file system"), (0, 2**19, "no space left")],
)
def test_a_read_only_or_full_file_system_is_a_config_error(toy, monkeypatch, flag, free, problem):
    """Neither can be made here (the tests run as root and cannot mount a small file system):
    the file system's answer is replaced, the check is the real one."""
    real = os.statvfs(toy.parent)
    fake = os.statvfs_result(
        (real.f_bsize, 1, real.f_blocks, free, free, *real[5:8], real.f_flag | flag, real[9])
    )
    monkeypatch.setattr(os, "statvfs", lambda path: fake)
    (line,) = errors_of(toy, f"runner.work_dir={toy.parent}/run")
    assert line.startswith("runner.work_dir: ") and problem in line
    assert not (toy.parent / "run").exists()


def test_optimizer_and_scheduler_sections_are_checked_before_any_model(toy):
    lines = errors_of(
        toy,
        "optimizer={type: AdamW, lr: -1, betas: [0.9, 0.999]}",
        "scheduler={main: {type: CosineAnealingLR, T_max: auto}}",
    )
    assert lines == [
        "optimizer: AdamW refuses these values: Invalid learning rate: -1",
        "scheduler.main.type: torch.optim.lr_scheduler has no class 'CosineAnealingLR' "
        "(did you mean 'CosineAnnealingLR'?)",
    ]
    lines = errors_of(
        toy,
        "optimizer={type: SGD, lr: 0.1, momentun: 0.9, param_groups: [{params: '*.bias', lrr: 1}]}",
        "scheduler={main: {type: StepLR, step_size: auto}, warmup: {}, interval: epoch}",
        "runner.scheduler_interval=iter",
    )
    assert lines == [
        "scheduler.warmup: give iters or epochs, one of them (got {})",
        "scheduler.interval: 'epoch' contradicts runner.scheduler_interval 'iter'; keep one "
        "of them",
        "optimizer.momentun: SGD takes no argument 'momentun' (did you mean 'momentum'?) "
        "(arguments: lr, momentum, dampening, weight_decay, nesterov, maximize, foreach, "
        "differentiable, fused)",
        "optimizer.param_groups.0.lrr: SGD takes no argument 'lrr' (did you mean 'lr'?) "
        "(arguments: lr, momentum, dampening, weight_decay, nesterov, maximize, foreach, "
        "differentiable, fused)",
        "scheduler.main.step_size: `auto` only fills T_max, total_iters, total_steps, T_0",
    ]
    # a quoted number is text: said, with what to write instead
    quoted = 'optimizer={type: SGD, lr: "1e-3"}'
    assert errors_of(toy, quoted, "task_args.optimizer=false") == [
        "optimizer.lr: '1e-3' is text to YAML, not a number; write 0.001"
    ]


def test_numbers_without_a_dot_are_numbers(toy):
    """YAML 1.2 reads 3e-3 as a number; PyYAML (YAML 1.1) reads it as text. Config files and
    --set values are read the 1.2 way, in every section."""
    toy.write_text(toy.read_text() + "optimizer: {type: AdamW, lr: 3e-3, weight_decay: 1E-4}\n")
    loaded = cfg.load(toy, ["task_args.optimizer=false", "optimizer.eps=1e-8"])
    assert loaded.data["optimizer"] == {
        "type": "AdamW", "lr": 0.003, "weight_decay": 0.0001, "eps": 1e-08
    }  # fmt: skip
    assert cfg.load(toy, ["task_args.width=2e1"]).data["task_args"]["width"] == 20.0
    assert cfg.load(toy, ["task_args.pause_dir=v1e3"]).data["task_args"]["pause_dir"] == "v1e3"


# -- through the real command line: exit 2, one line, nothing on disk ----------------------


def test_mistakes_only_the_task_shows_are_one_line_and_leave_nothing(toy, tmp_path, capsys):
    work = tmp_path / "runs" / "new"
    cases = {
        "task=toytask.py:a_string_model": [
            "task: toytask.py:a_string_model returned model of type str; expected a "
            "torch.nn.Module",
            "task: toytask.py:a_string_model returned no 'optimizer' and the config declares "
            "none; return one or add an optimizer: section (type: AdamW, lr: ...)",
            "task: toytask.py:a_string_model returned no 'train_dataloader'",
        ],
        "optimizer={type: SGD, lr: 0.1}": [
            "optimizer: declared in the config and also returned by task toytask.py:build; "
            "keep one (drop the optimizer: section, or stop returning it)"
        ],
    }
    for override, lines in cases.items():
        code, _, err = run_cli(capsys, "train", toy, "--work-dir", work, "--set", override)
        assert (code, err.splitlines()) == (2, lines)
        assert not (tmp_path / "runs").exists()  # not even the lock file's folder


def test_a_truncated_checkpoint_is_one_line_and_leaves_nothing(toy, tmp_path, capsys):
    work = tmp_path / "run"
    assert run_cli(capsys, "train", toy, "--work-dir", work)[0] == 0
    whole = (work / "checkpoints" / "epoch_2.pt").read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole[: len(whole) // 2])
    for command in ("val", "test"):
        code, out, err = run_cli(
            capsys, command, toy, "--checkpoint", cut, "--work-dir", tmp_path / command
        )
        assert (code, err) == (
            2,
            f"cannot load checkpoint {cut}: damaged, or not a torch.save file (reading it "
            "failed: Invalid argument)\n",
        )
        assert not (tmp_path / command).exists()


def test_a_file_that_is_no_checkpoint_is_said_to_be_none_in_one_line(toy, tmp_path):
    """``--resume base.yaml`` read ``IndexError: pop from empty list`` (the unpickler's)."""
    text = tmp_path / "base.yaml"
    text.write_text(toy.read_text())
    (tmp_path / "notes.json").write_text('{"a": 1}\n')
    (tmp_path / "bytes.bin").write_bytes(b"\x80\x02}q\x00.")  # a pickle, no torch.save

    def listing() -> set[Path]:  # less the bytecode cache of the task the check imports
        return {p for p in tmp_path.rglob("*") if "__pycache__" not in p.parts}

    before = listing()
    for name, reason in (
        ("base.yaml", "not a checkpoint (a text file, which torch cannot load)"),
        ("notes.json", "not a checkpoint (a text file, which torch cannot load)"),
        ("bytes.bin", "not a checkpoint (torch could not read it: RuntimeError: Invalid magic"),
    ):
        result = run("train", toy, "--resume", name, "--work-dir", "run", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"cannot load checkpoint {name}: {reason}"), line
    assert listing() == before


def test_a_class_name_suggests_and_takes_only_its_kind(toy):
    """``torch.optim.lr_scheduler`` imports ``Counter``, ``Optimizer``, ``Tensor``: they were
    suggested for a misspelt scheduler (``CosineLR``: did you mean 'Counter'?) and taken."""
    schedule = "scheduler={{main: {{type: {}}}}}"
    assert errors_of(toy, schedule.format("CosineLR")) == [
        "scheduler.main.type: torch.optim.lr_scheduler has no class 'CosineLR' "
        "(did you mean 'CosineAnnealingLR'?)"
    ]
    for name in ("Counter", "Optimizer", "Tensor", "LRScheduler"):
        (line,) = errors_of(toy, schedule.format(name))
        what = "the base class, not a" if name == "LRScheduler" else "not a"
        assert line.startswith(
            f"scheduler.main.type: torch.optim.lr_scheduler.{name} is {what} learning-rate "
            "scheduler; name one of "
        ), line
        assert "StepLR" in line and "Counter" not in line.partition("name one of")[2]
    (line,) = errors_of(toy, "optimizer={type: Optimizer, lr: 0.1}")
    assert line.startswith(
        "optimizer.type: torch.optim.Optimizer is the base class, not an optimizer; name one of "
    ), line
    assert errors_of(toy, "optimizer={type: Adamw, lr: 0.1}") == [
        "optimizer.type: torch.optim has no class 'Adamw' (did you mean 'AdamW'?)"
    ]
    assert errors_of(toy, schedule.format("ReduceLROnPlateau")) == []
    result = run("config", "validate", toy, "--set", schedule.format("CosineLR"))
    assert result.returncode == 2 and "did you mean 'CosineAnnealingLR'?" in result.stderr


def test_a_work_dir_that_is_a_file_is_refused_before_anything(toy, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    data = yaml.safe_load(toy.read_text())
    data["runner"]["work_dir"] = str(a_file)
    config = toy.parent / "file_work_dir.yaml"
    config.write_text(yaml.safe_dump(data))
    for extra in ([], ["--resume", "auto"]):
        assert run_cli(capsys, "train", config, *extra) == (
            2,
            "",
            f"runner.work_dir: {a_file} exists and is not a folder\n",
        )
    assert a_file.read_text() == "x"


# -- the fuzz --------------------------------------------------------------------------------

ODD_VALUES: list[Any] = [
    -1,
    0,
    1,
    2.5,
    -0.5,
    10**21,
    2**64,
    "",
    "x",
    "cuda",
    "meta",
    "cuda:7",
    None,
    True,
    False,
    [],
    {},
    [1],
    {"x": 5},
    "runs/a\0b",
    float("nan"),
    float("inf"),
    "auto",
    "SGD",
]
TOP_KEYS = ("task", "task_args", "runner", "plugins", "optimizer", "scheduler")


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested mapping (lists indexed)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append((*prefix, key))
            found += paths(value, (*prefix, key))
    return found


def mutate(data: dict[str, Any], rng: random.Random, a_file: Path) -> dict[str, Any]:
    """One to three random user mistakes: a key deleted, misspelt or added, a value
    replaced by an odd one, a work dir below a file (task_args values are the task's own)."""
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(paths(data))
        parent = data
        for key in where[:-1]:
            parent = parent[key]
        key = where[-1]
        kind = rng.choice(["delete", "typo", "value", "value", "add", "work_dir"])
        if kind == "delete" and key != "task":
            del parent[key]
        elif kind == "typo" and isinstance(key, str) and len(key) > 2:
            i = rng.randrange(len(key) - 1)
            typo = key[:i] + key[i + 1] + key[i] + key[i + 2 :]
            parent[typo] = parent.pop(key)
        elif kind == "value" and where[0] != "task_args":
            parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif kind == "add" and isinstance(parent, dict):
            parent[f"extra_{rng.randrange(100)}"] = rng.choice(ODD_VALUES)
        elif kind == "work_dir":
            data.setdefault("runner", {})
            if isinstance(data["runner"], dict):
                data["runner"]["work_dir"] = str(a_file / "run")
    return data


def test_a_seeded_fuzz_of_the_example_config_ends_in_lines_or_a_valid_config(
    tmp_path, capsys, monkeypatch
):
    base = yaml.safe_load(DIGITS.read_text())
    base["task"] = f"{DIGITS.parent / 'task.py'}:build"
    base["runner"]["work_dir"] = str(tmp_path / "runs" / "digits")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    rng = random.Random(16)
    invalid: list[tuple[Path, list[str]]] = []
    valid: list[Path] = []
    for i in range(100):
        path = tmp_path / f"mutant_{i}.yaml"
        mutant = mutate(base, rng, a_file)
        path.write_text(yaml.safe_dump(mutant, allow_unicode=True))
        lines = errors_of(path)  # anything but a ConfigError fails the test here
        for line in lines:  # each starts with the dotted path of the mistake
            head = line.split(": ", 1)[0].split(".")[0]
            assert head in TOP_KEYS or head in mutant, line
            assert "\n" not in line and "Traceback" not in line
        (invalid.append((path, lines)) if lines else valid.append(path))
    assert len(invalid) > 60 and len(valid) > 8  # the mutations hit both ways (87 and 13)
    assert not (tmp_path / "runs").exists()

    # a sample through `hookrun train`: the same lines, exit 2, nothing created
    cwd = tmp_path / "cwd"  # where a mutated relative work dir goes
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for path, lines in rng.sample(invalid, 4):
        assert run_cli(capsys, "train", path) == (2, "", "".join(f"{x}\n" for x in lines))
    assert not (tmp_path / "runs").exists() and not any(cwd.iterdir())
    # a valid mutant trains for a tiny budget (in this process: its exit code is what counts)
    path = rng.choice(valid)
    budget = ("--set", "runner.max_epochs=null", "--set", "runner.max_iters=22")  # > warm-up
    code, _, err = run_cli(capsys, "train", path, *budget, "--set", "runner.val_interval=22")
    assert code == 0, (path.read_text(), err)


# -- names two distributions register ------------------------------------------------------


def test_a_plugin_or_writer_name_of_two_distributions_is_named_with_both(
    make_dist, toy, tmp_path, capsys
):
    make_dist(
        "my-timer",
        "my_timer_mod",
        "from hookrun_timer import Timer as X\n",
        {"hookrun.plugins": {"timer": "my_timer_mod:X"}},
    )
    for dist in ("w-one", "w-two"):
        make_dist(
            dist,
            dist.replace("-", "_"),
            "from hookrun.writers import JsonlWriter as W\n",
            {"hookrun.writers": {"mywriter": f"{dist.replace('-', '_')}:W"}},
        )
    code, out, err = run_cli(capsys, "plugins", "list")
    assert code == 0 and "timer" in out
    (warning,) = err.splitlines()
    assert warning.startswith("warning: plugin name 'timer' is registered by 2 distributions: ")
    assert "hookrun-timer 0.1.0 (hookrun_timer:Timer)" in warning
    assert "my-timer 1.2.3 (my_timer_mod:X)" in warning and warning.endswith("all but one")

    assert errors_of(toy) == []  # the toy config turns the timer off: no ambiguity
    assert errors_of(toy, "plugins.timer=true", "runner.writers=[jsonl, mywriter]") == [
        "runner.writers.mywriter: writer name 'mywriter' is registered by 2 distributions: "
        "w-one 1.2.3 (w_one:W), w-two 1.2.3 (w_two:W); uninstall all but one",
        "plugins.timer: " + warning.removeprefix("warning: "),
    ]
    work = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", toy, "--work-dir", work, "--set", "plugins.timer={}")
    assert (code, err) == (2, "plugins.timer: " + warning.removeprefix("warning: ") + "\n")
    assert not work.exists()


def test_plugins_new_refuses_an_installed_name(tmp_path, capsys):
    assert run_cli(capsys, "plugins", "new", "ema", "--dir", tmp_path) == (
        2,
        "",
        "plugin name 'ema' is taken by the installed distribution 'hookrun-ema 0.1.0' "
        "(hookrun_ema:EMA); choose another name\n",
    )
    assert not any(tmp_path.iterdir())

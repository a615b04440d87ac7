"""Several optimizers declared in the config: ``optimizer:`` and ``scheduler:`` as mappings of
names, each optimizer over the submodule its ``params:`` names; bad sections are one line
before any work; ``hookrun schedule`` shows each optimizer's rates as the run logs them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _support import errors_of
from hookrun.cli.build import build_task
from hookrun.cli.prepare import build_runner
from hookrun.config import file as cfg
from hookrun.errors import ConfigError
from hookrun.testing import forked, isolated_env

pytestmark = pytest.mark.usefixtures("hookrun_isolated")

GAN_TASK = """
import torch
from torch import nn


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
        self.discriminator = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))

    def forward(self, x):
        return self.discriminator(self.generator(x))


def build(own_optimizers: bool = False):
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(5)]
    model = GAN()
    task = {"model": model, "train_dataloader": data, "criterion": nn.MSELoss()}
    if own_optimizers:
        task["optimizer"] = {
            "generator": torch.optim.SGD(model.generator.parameters(), lr=0.1),
            "discriminator": torch.optim.SGD(model.discriminator.parameters(), lr=0.2),
        }
    return task
"""

#: 5 batches an epoch in groups of 2 (the epoch's last batch closes a group): 3 optimizer
#: steps an epoch, 6 in the run; the generator's schedule warms up over 2 of them.
GAN_CONFIG = """
task: gan.py:build
runner: {max_epochs: 2, device: cpu, writers: [jsonl], log_interval: 1, grad_accum: 2}
optimizer:
  generator: {type: Adam, lr: 1.0e-3, params: generator}
  discriminator: {type: SGD, lr: 1.0e-2, momentum: 0.5, params: discriminator}
scheduler:
  generator:
    warmup: {iters: 2, start_factor: 0.5}
    main: {type: CosineAnnealingLR, T_max: auto, eta_min: 1.0e-5}
    interval: iter
  discriminator: {main: {type: CosineAnnealingLR, T_max: auto}, interval: iter}
plugins: {checkpoint: false, logger: false, timer: false}
"""
STEPS, WARM = 6, 2


@pytest.fixture
def gan(tmp_path: Path) -> Path:
    (tmp_path / "gan.py").write_text(textwrap.dedent(GAN_TASK))
    config = tmp_path / "gan.yaml"
    config.write_text(textwrap.dedent(GAN_CONFIG))
    return config


def hookrun(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``hookrun`` CLI in a process of its own."""
    return forked.run(
        [sys.executable, "-m", "hookrun", *map(str, args)],
        cwd=cwd,
        env=isolated_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def ids(parameters: object) -> set[int]:
    return {id(p) for p in parameters}  # type: ignore[attr-defined]


def test_named_sections_build_an_optimizer_over_each_submodule(gan, tmp_path):
    objects = build_task(cfg.load(gan, work_dir=tmp_path / "run"), training=True)
    model, optimizers = objects["model"], objects["optimizer"]
    assert list(optimizers) == ["generator", "discriminator"]
    trained = {
        name: ids(p for g in opt.param_groups for p in g["params"])
        for name, opt in optimizers.items()
    }
    assert trained == {
        "generator": ids(model.generator.parameters()),
        "discriminator": ids(model.discriminator.parameters()),
    }
    assert type(optimizers["generator"]).__name__ == "Adam"
    assert optimizers["discriminator"].param_groups[0]["momentum"] == 0.5
    schedulers = objects["scheduler"]
    assert list(schedulers) == ["generator", "discriminator"]
    assert schedulers["generator"].optimizer is optimizers["generator"]
    assert schedulers["discriminator"].optimizer is optimizers["discriminator"]


def test_params_names_a_nested_submodule_in_one_section_too(gan, tmp_path):
    one = "optimizer={type: SGD, lr: 0.1, params: generator.2}"
    loaded = cfg.load(gan, [one, "scheduler=null"], work_dir=tmp_path / "run")
    objects = build_task(loaded, training=True)
    optimizer = objects["optimizer"]
    assert type(optimizer).__name__ == "SGD"  # one section: one optimizer, as before
    last = objects["model"].generator[2]
    assert ids(optimizer.param_groups[0]["params"]) == ids(last.parameters())


def test_named_schedules_over_the_optimizers_a_task_returns(gan, tmp_path):
    own = ["task_args.own_optimizers=true", "optimizer=null"]
    objects = build_task(cfg.load(gan, own, work_dir=tmp_path / "run"), training=True)
    optimizers, schedulers = objects["optimizer"], objects["scheduler"]
    assert {n: s.optimizer for n, s in schedulers.items()} == optimizers
    assert schedulers["discriminator"].T_max == STEPS
    one = "scheduler={main: {type: StepLR, step_size: 1}}"
    with pytest.raises(ConfigError) as refused:
        build_task(cfg.load(gan, [*own, one], work_dir=tmp_path / "run"), training=True)
    assert refused.value.lines == [
        "scheduler: one schedule for the optimizers generator, discriminator; give each its "
        "own by name (scheduler: {generator: {main: ...}})"
    ]


def test_auto_lengths_are_each_schedules_optimizer_steps(gan, tmp_path):
    """``T_max: auto`` of each named schedule is the optimizer steps the run then takes (after
    that schedule's warm-up): each cosine ends at its minimum exactly at the run's end."""
    runner = build_runner(cfg.load(gan, work_dir=tmp_path / "run"))
    generator, discriminator = (runner.schedulers[n] for n in ("generator", "discriminator"))
    cosine = generator._schedulers[1]  # SequentialLR: LinearLR warm-up, then the main one
    assert (cosine.T_max, discriminator.T_max) == (STEPS - WARM, STEPS)
    runner.train()
    assert runner.position.optimizer_steps == {"generator": STEPS, "discriminator": STEPS}
    assert runner.optimizers["generator"].param_groups[0]["lr"] == pytest.approx(1e-5)
    assert runner.optimizers["discriminator"].param_groups[0]["lr"] == pytest.approx(0, abs=1e-12)


def reference(step: int, base: float, warm: int, start: float, total: int, eta: float) -> float:
    """Linear warm-up then cosine annealing, from their formulas (not torch's classes)."""
    if step < warm:
        return base * (start + (1 - start) * step / warm)
    return eta + (base - eta) * (1 + math.cos(math.pi * (step - warm) / (total - warm))) / 2


def test_schedule_shows_each_optimizer_as_the_run_logs_it(gan, tmp_path):
    shown = hookrun("schedule", gan, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()  # after the "building task" notice
    assert lines[1].split() == [
        "iter",
        "epoch",
        "lr/generator",
        "lr/discriminator",
        "momentum/generator",
        "momentum/discriminator",
    ]
    assert lines[-1] == "10 iterations; the schedule steps per iter"
    as_json = hookrun("schedule", gan, "--json", cwd=tmp_path)
    planned = json.loads(as_json.stdout)
    assert [p["momentum"] for p in planned] == [{"generator": [0.9], "discriminator": [0.5]}] * 10
    # the rate of each iteration is that of the optimizer steps before it: groups of 2, the
    # epoch's 5th batch closing one
    steps_before = [0, 0, 1, 1, 2, 3, 3, 4, 4, 5]
    assert [p["lr"]["generator"][0] for p in planned] == pytest.approx(
        [reference(s, 1e-3, WARM, 0.5, STEPS, 1e-5) for s in steps_before], rel=1e-9
    )
    assert [p["lr"]["discriminator"][0] for p in planned] == pytest.approx(
        [reference(s, 1e-2, 0, 1.0, STEPS, 0.0) for s in steps_before], rel=1e-9, abs=1e-15
    )

    trained = hookrun("train", gan, "--work-dir", tmp_path / "run", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    log = (tmp_path / "run" / "log.jsonl").read_text()
    records = [json.loads(line) for line in log.splitlines()]
    for name in ("generator", "discriminator"):
        logged = {r["step"]: r[f"train/lr/{name}"] for r in records if f"train/lr/{name}" in r}
        assert logged == {p["iter"]: p["lr"][name][0] for p in planned}  # exact


WITH_TYPE = "optimizer.discriminator.type"

#: A mistake, the override that makes it, its line, and whether ``config validate`` (which
#: imports no user code, so knows no model) finds it too.
MISTAKES = {
    "params names no submodule": (
        ["optimizer.generator.params=generatr"],
        "optimizer.generator.params: the model has no submodule 'generatr' (did you mean "
        "'generator'?) (its submodules: generator, discriminator)",
        False,
    ),
    "nested params names no submodule": (
        ["optimizer.generator.params=generator.5"],
        "optimizer.generator.params: generator has no submodule '5' (its submodules: 0, 1, 2)",
        False,
    ),
    "scheduler name is no optimizer's": (
        ["scheduler.critic={main: {type: StepLR, step_size: 1}}"],
        "scheduler.critic: no optimizer named 'critic' (optimizers: generator, discriminator)",
        True,
    ),
    "one named section lacks type": (
        [f"{WITH_TYPE}=null"],
        f"{WITH_TYPE}: Input should be a valid string (got None)",
        True,
    ),
    "a section without type at all": (
        ["optimizer.discriminator={lr: 0.1, params: discriminator}"],
        f"{WITH_TYPE}: required setting is missing",
        True,
    ),
    "two sections train one parameter": (
        ["optimizer.discriminator.params=generator.0"],
        "optimizer: 'generator' and 'discriminator' both train a parameter of shape [8, 3]; "
        "give each optimizer its own parameters",
        False,
    ),
    "one schedule for several optimizers": (
        ["scheduler={main: {type: StepLR, step_size: 1}}"],
        "scheduler: one schedule for the optimizers generator, discriminator; give each its "
        "own by name (scheduler: {generator: {main: ...}})",
        True,
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_bad_section_is_one_line_exit_2_and_nothing_written(gan, tmp_path, mistake):
    overrides, line, validate_knows = MISTAKES[mistake]
    sets = [arg for override in overrides for arg in ("--set", override)]
    before = files(tmp_path)
    work = tmp_path / "run"
    trained = hookrun("train", gan, "--work-dir", work, *sets, cwd=tmp_path)
    assert trained.returncode == 2, (trained.stdout, trained.stderr)
    assert "Traceback" not in trained.stderr
    errors = [e for e in trained.stderr.splitlines() if not e.startswith("[hookrun]")]
    assert errors == [line]
    # what ``config validate`` prints (in this process: the same check, no second start)
    assert errors_of(gan, *overrides) == ([line] if validate_knows else [])
    assert not work.exists() and files(tmp_path) == before


def files(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` and its bytes (Python's own bytecode cache left out)."""
    return {
        p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }

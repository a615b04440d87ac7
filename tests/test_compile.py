"""Compiled models (docs/compiled-models.md): ``runner.compile`` compiles in place, the step
of a ``training_step`` model runs compiled, checkpoints and exports hold plain names, and a
checkpoint whose names carry ``_orig_mod.`` loads into a plain and a compiled model.

Compilation uses dynamo's ``eager`` backend (the captured graph run by the ordinary ATen
kernels, so a compiled run is bit-identical to an eager one and compiles in milliseconds) or
a counting backend; inductor would cost seconds per graph on this CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from _support import run
from hookrun import Runner
from hookrun.checkpoint.export import export
from hookrun.errors import ConfigError
from hookrun.testing import (
    assert_same_checkpoint,
    load_checkpoint,
    run_cli,
    run_ranks,
    toy_model,
    toy_runner_kwargs,
    write_toy_task,
)


class Net(nn.Module):
    """A small MLP whose ``training_step`` calls its own forward (``self(x)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)


def net() -> Net:
    torch.manual_seed(0)
    return Net()


class CountingBackend:
    """A dynamo backend that compiles nothing and counts the graphs it is given and how
    often their compiled code runs."""

    def __init__(self) -> None:
        self.graphs = 0
        self.runs = 0

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Any:
        self.graphs += 1

        def compiled(*args: Any) -> Any:
            self.runs += 1
            return gm.forward(*args)

        return compiled


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Each test counts its own graphs."""
    torch._dynamo.reset()
    counters.clear()


def kwargs(tmp_path: Path, model: nn.Module, **overrides: Any) -> dict[str, Any]:
    """The toy task (2 epochs of 3 batches) trained by ``model``'s ``training_step``, with a
    checkpoint every epoch."""
    base = toy_runner_kwargs(
        tmp_path,
        model=model,
        criterion=None,
        val_dataloader=None,
        metrics={},
        plugins={"checkpoint": {}},
    )
    return {**base, **overrides}


def model_keys(path: Path) -> list[str]:
    return list(load_checkpoint(path)["model"])


def test_compile_runs_the_training_step_compiled_and_saves_plain_names(tmp_path):
    backend = CountingBackend()
    runner = Runner(**kwargs(tmp_path, net(), compile={"backend": backend}))
    runner.train()
    assert backend.graphs >= 1 and counters["stats"]["unique_graphs"] >= 1
    assert backend.runs == 6  # every iteration's self(x) ran the compiled graph
    expected = [k for k in Net().state_dict()]
    for path in sorted(runner.checkpoint_dir.glob("*.pt")):
        assert model_keys(path) == expected


def test_a_torch_compile_wrapper_trains_compiled_under_plain_names(tmp_path):
    """The wrapper's training_step is the original module's: hookrun trains the module it
    wraps, compiled in place with the wrapper's own backend."""
    backend = CountingBackend()
    model = net()
    runner = Runner(**kwargs(tmp_path, torch.compile(model, backend=backend)))
    assert runner.unwrapped_model is model
    runner.train()
    assert backend.runs == 6
    assert model_keys(runner.checkpoint_dir / "epoch_2.pt") == list(Net().state_dict())


def test_a_wrapped_submodule_is_unwrapped_and_stays_compiled(tmp_path):
    backend = CountingBackend()
    model = net()
    inner = model.net
    model.net = torch.compile(inner, backend=backend)  # as a script compiles one part
    runner = Runner(**kwargs(tmp_path, model))
    assert runner.unwrapped_model.net is inner
    runner.train()
    assert backend.runs == 6
    assert model_keys(runner.checkpoint_dir / "epoch_2.pt") == list(Net().state_dict())


def test_compile_true_from_a_config_file_keeps_plain_names(tmp_path, capsys):
    config = write_toy_task(
        tmp_path,
        "task: toytask.py:build\n"
        "runner: {max_epochs: 2, device: cpu, writers: [], compile: {backend: eager}}\n"
        "plugins: {checkpoint: true, logger: false, timer: false}\n",
    )
    code, _, err = run_cli(capsys, "train", config, "--work-dir", tmp_path / "run")
    assert code == 0, err
    assert counters["stats"]["unique_graphs"] >= 1  # the CLI's run compiled the model
    assert model_keys(tmp_path / "run" / "checkpoints" / "epoch_2.pt") == ["weight", "bias"]


def test_an_unknown_compile_option_is_one_line_exit_2_nothing_written(tmp_path):
    config = write_toy_task(
        tmp_path,
        "task: toytask.py:build\nrunner: {max_epochs: 1, device: cpu, compile: {fulgraph: true}}\n",
    )
    before = sorted(tmp_path.rglob("*"))
    done = run("train", config, "--work-dir", tmp_path / "run", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(
        "runner.compile: 'fulgraph' is not an option of torch.compile (did you mean 'fullgraph'?)"
    )
    assert sorted(tmp_path.rglob("*")) == before


def test_the_runner_refuses_an_unknown_compile_option(tmp_path):
    with pytest.raises(ConfigError, match=r"^runner\.compile: 'mod' is not an option"):
        Runner(**kwargs(tmp_path, net(), compile={"mod": "reduce-overhead"}))
    assert not (tmp_path / "run").exists()


def with_orig_mod_names(path: Path) -> None:
    """Rewrite a checkpoint's weights under ``torch.compile(model).state_dict()``'s names,
    as a run that saved the wrapper's state dict wrote them."""
    state = torch.load(path, weights_only=True)
    state["model"] = {f"_orig_mod.{k}": v for k, v in state["model"].items()}
    torch.save(state, path)


def reference(tmp_path: Path) -> Path:
    """The run never interrupted: 2 epochs, eager."""
    runner = Runner(**kwargs(tmp_path / "reference", net()))
    runner.train()
    return runner.checkpoint_dir / "epoch_2.pt"


def test_orig_mod_checkpoint_resumes_into_a_plain_model_bit_identical(tmp_path, capsys):
    """A torch.compile(model) user's first epoch (``eager`` backend), its checkpoint's names
    as the wrapper's state dict has them, resumed by a plain model: one notice line, and
    the end is the uninterrupted eager run's bit for bit."""
    first = Runner(**kwargs(tmp_path, torch.compile(net(), backend="eager"), max_epochs=1))
    first.train()
    with_orig_mod_names(first.checkpoint_dir / "epoch_1.pt")
    capsys.readouterr()
    Runner(**kwargs(tmp_path, net())).train(resume="auto")
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if "_orig_mod." in line]) == 1
    assert_same_checkpoint(reference(tmp_path), first.checkpoint_dir / "epoch_2.pt", 5)


def test_plain_checkpoint_resumes_into_a_compiled_model_bit_identical(tmp_path):
    """The counting backend runs dynamo's graph eagerly: bit-identical to the eager run."""
    first = Runner(**kwargs(tmp_path, net(), max_epochs=1))
    first.train()
    backend = CountingBackend()
    Runner(**kwargs(tmp_path, net(), compile={"backend": backend})).train(resume="auto")
    assert backend.runs == 3  # the second epoch ran compiled
    assert_same_checkpoint(reference(tmp_path), first.checkpoint_dir / "epoch_2.pt", 5)


def test_orig_mod_checkpoint_resumes_into_a_compiled_model(tmp_path, capsys):
    """``eager`` backend: the end is the uninterrupted eager run's bit for bit."""
    first = Runner(**kwargs(tmp_path, net(), max_epochs=1))
    first.train()
    with_orig_mod_names(first.checkpoint_dir / "epoch_1.pt")
    Runner(**kwargs(tmp_path, net(), compile={"backend": "eager"})).train(resume="auto")
    assert "_orig_mod." in capsys.readouterr().out
    assert_same_checkpoint(reference(tmp_path), first.checkpoint_dir / "epoch_2.pt", 5)


def test_export_writes_plain_names_from_an_orig_mod_checkpoint(tmp_path):
    runner = Runner(**kwargs(tmp_path, net(), max_epochs=1))
    runner.train()
    path = runner.checkpoint_dir / "epoch_1.pt"
    with_orig_mod_names(path)
    assert export(path, tmp_path / "out.pt") == 4
    weights = torch.load(tmp_path / "out.pt", weights_only=True)
    plain = Net()
    plain.load_state_dict(weights)  # strict: every name plain
    for key, value in plain.state_dict().items():
        assert torch.equal(value, runner.unwrapped_model.state_dict()[key])


@pytest.mark.parametrize(
    ("plugin", "settings"),
    [("ema", {"decay": 0.5}), ("precise_bn", {"num_batches": 2})],
)
def test_ema_and_precise_bn_on_a_compiled_model_match_eager(tmp_path, plugin, settings):
    """The plugin's state and the weights of a compiled run are those of an eager run."""
    ends = []
    for name, compile in (("eager", False), ("compiled", {"backend": "eager"})):
        runner = Runner(
            **toy_runner_kwargs(
                tmp_path / name,
                model=toy_model(batch_norm=True),
                plugins={"checkpoint": {}, plugin: settings},
                compile=compile,
            )
        )
        runner.train()
        ends.append(runner.checkpoint_dir / "epoch_2.pt")
    assert counters["stats"]["unique_graphs"] >= 1
    assert_same_checkpoint(*ends, min_tensors=5, plugins=[plugin] if plugin == "ema" else [])


@pytest.mark.slow
def test_ddp_and_fsdp_run_a_training_step_that_calls_self_compiled_or_not(tmp_path):
    """Under DDP the wrapper's forward is routed to ``training_step``; its own ``self(x)``
    reaches the (compiled) forward. Eager backend: both DDP runs end with the same weights;
    FSDP, compiled before sharding, ends with them too (its reduce-scatter rounds apart)."""
    job = Path(__file__).parent / "jobs" / "compile_job.py"
    ends = []
    runs = (("plain", ()), ("compiled", ("--compile",)), ("fsdp", ("--compile", "--fsdp")))
    for name, flag in runs:
        outputs = run_ranks(job, tmp_path / name, *flag)
        graphs = [
            int(line.split()[1])
            for out in outputs
            for line in out.splitlines()
            if line.startswith("graphs ")
        ]
        assert len(graphs) == 2 and all((g >= 1) == bool(flag) for g in graphs), outputs
        ends.append(torch.load(tmp_path / name / "weights.pt", weights_only=True))
    assert ends[0].keys() == ends[1].keys() == ends[2].keys() == Net().state_dict().keys()
    for key in ends[0]:
        assert torch.equal(ends[0][key], ends[1][key]), key
        torch.testing.assert_close(ends[2][key], ends[0][key], rtol=1e-5, atol=1e-6)

"""``strategy: fsdp`` with real processes: torchrun, gloo, two ranks (jobs in jobs/fsdp_job.py)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from hookrun import Runner
from hookrun.checkpoint.sharded import full_model_state
from hookrun.checkpoint.state import load
from hookrun.cli.commands import main as cli_main
from hookrun.config.arguments import FsdpSettings
from hookrun.distributed.fsdp import units_to_shard
from hookrun.errors import CheckpointMismatchError, ConfigError
from hookrun.testing import once_per_session, run_job, toy_data
from jobs.fsdp_job import BUILT_IN, EMA_ONLY, RUN, Block, build, model

JOB = Path(__file__).parent / "jobs" / "fsdp_job.py"


def torchrun(*args: str | Path, expect: int = 0, ranks: int = 2):
    """Two ranks (or ``ranks``) on the CPU (gloo) under the real launcher."""
    command = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *args]
    return run_job(command, expect=expect, env={**os.environ, "OMP_NUM_THREADS": "1"})


def scalars(work_dir: Path, name: str) -> dict[int, float]:
    lines = (work_dir / "log.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return {row["step"]: row[name] for row in rows if name in row}


@pytest.fixture(scope="module")
def compared(request, tmp_path_factory):
    """One launch for the session (every xdist worker reads it): the same 2-rank run under
    DDP and under FSDP, and the runs after them (fsdp_job.main)."""
    return once_per_session(request, tmp_path_factory, "fsdp_compare", lambda d: torchrun(JOB, d))


def result(work_dir: Path, rank: int) -> dict:
    return torch.load(work_dir / f"result_rank{rank}.pt", weights_only=True)


def test_fsdp_ends_with_the_weights_metrics_and_hook_points_of_ddp(compared):
    # FSDP2 reduces the same sums as DDP, so the weights agree to float rounding: bit for
    # bit here; the tolerance allows another order of the reduction elsewhere
    for rank in (0, 1):
        ddp, fsdp = result(compared / "ddp", rank), result(compared / "fsdp", rank)
        assert set(fsdp["sharded"]) == {"DTensor"} and set(ddp["sharded"]) == {"Parameter"}
        assert fsdp["weights"].keys() == ddp["weights"].keys()
        for name, tensor in ddp["weights"].items():
            torch.testing.assert_close(fsdp["weights"][name], tensor, rtol=0, atol=1e-6)
        assert fsdp["metrics"] == pytest.approx(ddp["metrics"], rel=1e-6)
        assert fsdp["calls"] == ddp["calls"]
        # rank 0 has two validation batches of 9 samples, rank 1 one (its other forward
        # under FSDP repeats its batch uncounted)
        assert ddp["calls"].count("after_val_iter@10") == 2 - rank
    start = torch.load(compared / "start.pt", weights_only=True)
    assert not torch.equal(start["4.weight"], ddp["weights"]["4.weight"])  # it trained


def test_clipping_sees_the_norm_of_every_shard(compared):
    ddp = scalars(compared / "ddp", "train/grad_norm")
    fsdp = scalars(compared / "fsdp", "train/grad_norm")
    assert ddp.keys() == fsdp.keys() and len(ddp) >= 2
    assert fsdp == pytest.approx(ddp, rel=1e-6)
    assert min(ddp.values()) > 0.05  # the clip (0.05) was in force at every step


def test_fsdp_in_one_process_is_a_one_line_config_error(tmp_path):
    work_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as info:
        Runner(**build(), strategy="fsdp", work_dir=work_dir)
    assert str(info.value) == (
        "runner.strategy: 'fsdp' shards the model over processes and this run has one; start "
        "it with torchrun --nproc-per-node=N (N > 1), or use strategy auto"
    )
    assert not work_dir.exists()


def test_wrap_names_a_class_the_model_lacks():
    with pytest.raises(ConfigError) as info:
        units_to_shard(model(), FsdpSettings(wrap=["Block", "TransformerBlock"]))
    assert str(info.value) == (
        "runner.fsdp.wrap: no submodule of class 'TransformerBlock' in the model (its classes: "
        "BatchNorm1d, Block, Linear)"
    )


def test_units_by_name_and_by_parameter_count():
    net = model()  # Linear(6,16): 112, BatchNorm1d: 32, Block: 272 each, Linear(16,2): 34
    blocks = [m for m in net.modules() if isinstance(m, Block)]
    assert units_to_shard(net, FsdpSettings(wrap=["Block"])) == blocks
    by_size = units_to_shard(net, FsdpSettings(min_params=100))
    assert by_size == [net[0], blocks[0].linear, blocks[1].linear]  # innermost first
    assert units_to_shard(net, FsdpSettings()) == []


def test_runner_fsdp_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError) as info:
        Runner(nn.Linear(2, 2), toy_data(), strategy="fsdp", fsdp={"wrapp": []}, work_dir=tmp_path)
    assert (
        str(info.value) == "runner.fsdp.wrapp: unknown key (did you mean 'wrap'?) (keys: "
        "wrap, min_params, reshard_after_forward, cpu_offload)"
    )


# -- sharded checkpoints ---------------------------------------------------------------------


def test_sigkill_inside_a_sharded_save_keeps_the_previous_folder_and_resume_is_exact(
    compared, tmp_path
):
    """Both launches through ``torchrun -m hookrun train CONFIG`` with strategy fsdp."""
    config = tmp_path / "config.yaml"
    runner = {**RUN, "work_dir": str(tmp_path / "run")}
    config.write_text(yaml.safe_dump({"task": f"{JOB}:build", "runner": runner}))
    # rank 1 dies right after DCP wrote its shard of iter_9, before .metadata
    torchrun("-m", "hookrun", "train", config, "--set", "task_args.kill_in_save=9", expect=1)
    folder = tmp_path / "run" / "checkpoints"
    names = [".iter_9.pt.partial", "iter_4.pt", "iter_7.pt"]
    assert sorted(p.name for p in folder.iterdir()) == names
    assert not (folder / ".iter_9.pt.partial" / ".metadata").exists()
    shards = [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    assert sorted(p.name for p in (folder / "iter_7.pt").iterdir()) == shards
    torchrun("-m", "hookrun", "train", config, "--resume", "auto")
    assert sorted(p.name for p in folder.iterdir()) == ["iter_4.pt", "iter_7.pt", "iter_9.pt"]
    for rank in (0, 1):
        reference, resumed = result(compared / "fsdp", rank), result(tmp_path / "run", rank)
        assert resumed["resumed_from"] == str(folder / "iter_7.pt")
        for name, tensor in reference["weights"].items():
            assert torch.equal(resumed["weights"][name], tensor), name  # bit for bit
        assert resumed["metrics"] == reference["metrics"]


class Payload:
    """Unpickling it would create the file it names."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_sharded_folder_is_loaded_without_unpickling_code(compared, tmp_path):
    folder = tmp_path / "iter_9.pt"
    shutil.copytree(compared / "fsdp" / "checkpoints" / "iter_9.pt", folder)
    metadata = folder / ".metadata"
    good = metadata.read_bytes()
    assert load(folder)["loop"]["iter"] == 9
    touched = tmp_path / "touched"
    metadata.write_bytes(pickle.dumps(Payload(touched)))
    with pytest.raises(CheckpointMismatchError) as info:
        load(folder)
    assert str(info.value) == (
        f"cannot load checkpoint {folder}: its .metadata is not DCP's metadata "
        "(pathlib.Path.touch is not part of DCP's metadata)"
    )
    assert not touched.exists()
    # an entry DCP would read with torch.load(weights_only=False) is refused too
    declared = pickle.loads(good)
    declared.state_dict_metadata["model.4.bias"] = BytesStorageMetadata()
    metadata.write_bytes(pickle.dumps(declared))
    with pytest.raises(CheckpointMismatchError, match=r"\(model\.4\.bias is not a tensor\)$"):
        load(folder)
    (folder / ".metadata").unlink()
    with pytest.raises(CheckpointMismatchError, match="not a complete sharded checkpoint"):
        load(folder)


def test_a_sharded_folder_resumes_in_one_process(compared, tmp_path):
    folder = compared / "fsdp" / "checkpoints" / "iter_9.pt"
    task = build()
    runner = Runner(**task, work_dir=tmp_path, writers=())
    runner.load_checkpoint(folder, resume=True)
    assert runner.iter == 9
    weights = full_model_state(folder)
    assert weights.keys() == runner.unwrapped_model.state_dict().keys()
    for name, tensor in runner.unwrapped_model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    momentum = [runner.optimizer.state[p]["momentum_buffer"] for p in task["model"].parameters()]
    assert len(momentum) == 10 and all(m.abs().sum() > 0 for m in momentum)


def test_the_checkpoint_plugin_writes_folders_under_fsdp(compared):
    """With checkpoint (by epoch, max_keep 1, save_best accuracy), timer, logger and
    precise-BN on."""
    folder = compared / "plugins_fsdp" / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    best = ["best_accuracy.pt"]
    assert names == [*best, "epoch_2.pt", "iter_4.pt", "iter_7.pt", "iter_9.pt", "latest"]
    assert (folder / "latest").read_text() == "epoch_2.pt\n"
    for name in names[:-1]:  # every one complete, epoch_1.pt rotated out
        assert (folder / name / ".metadata").is_file() and (folder / name / "state.pt").is_file()
    state = torch.load(folder / "best_accuracy.pt" / "state.pt", weights_only=True)
    entry = state["plugins"]["checkpoint"]["best"]["accuracy"]
    rows = [
        json.loads(line)
        for line in (compared / "plugins_fsdp" / "log.jsonl").read_text().splitlines()
    ]
    scores = {row["step"]: row["val/accuracy"] for row in rows if "val/accuracy" in row}
    assert entry["score"] == max(scores.values()) and entry["file"] == "best_accuracy.pt"
    weights = full_model_state(folder / "epoch_2.pt")
    final = result(compared / "plugins_fsdp", 0)["weights"]
    assert all(torch.equal(weights[k], final[k]) for k in final)


# -- hookrun export --------------------------------------------------------------------------


def export(capsys, *args: str | Path) -> tuple[int, str]:
    """``hookrun export ARGS`` through the CLI's entry point: exit status, stderr lines."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["export", *map(str, args)])
    return exit_info.value.code, capsys.readouterr().err.strip()


def test_export_of_a_folder_loads_into_the_plain_model(compared, tmp_path, capsys):
    out = tmp_path / "weights.pt"
    assert export(capsys, compared / "plugins_fsdp" / "checkpoints" / "epoch_2.pt", out) == (0, "")
    net = model()
    net.load_state_dict(torch.load(out, weights_only=True))  # strict: every key, no more
    final = result(compared / "plugins_fsdp", 0)["weights"]  # gathered by the run itself
    for name, tensor in net.state_dict().items():
        assert torch.equal(tensor, final[name]), name


def test_export_of_a_file_equals_the_export_of_the_same_state_sharded(compared, tmp_path, capsys):
    # DDP saved iter_9.pt as a file, FSDP as a folder: the same weights (to 1e-6, above)
    from_file, from_folder = tmp_path / "file.pt", tmp_path / "folder.pt"
    assert export(capsys, compared / "ddp" / "checkpoints" / "iter_9.pt", from_file)[0] == 0
    assert export(capsys, compared / "fsdp" / "checkpoints" / "iter_9.pt", from_folder)[0] == 0
    left = torch.load(from_file, weights_only=True)
    right = torch.load(from_folder, weights_only=True)
    assert left.keys() == right.keys() == model().state_dict().keys()
    for name, tensor in left.items():
        torch.testing.assert_close(right[name], tensor, rtol=0, atol=1e-6)


def test_export_ema_writes_the_average(tmp_path, capsys, hookrun_isolated):
    task = build()
    task["hooks"] = []
    runner = Runner(**task, max_iters=4, work_dir=tmp_path, writers=(), plugins={"ema": {}})
    runner.train()
    path = runner.save_checkpoint(tmp_path / "last.pt")
    out = tmp_path / "ema.pt"
    assert export(capsys, path, out, "--ema") == (0, "")
    average = torch.load(out, weights_only=True)
    saved = torch.load(path, weights_only=True)["plugins"]["ema"]["model"]
    assert average.keys() == saved.keys() and all(torch.equal(average[k], saved[k]) for k in saved)
    assert not torch.equal(average["4.weight"], runner.unwrapped_model.state_dict()["4.weight"])
    model().load_state_dict(average)


def test_export_errors_are_one_line_and_write_nothing(compared, tmp_path, capsys):
    folder = compared / "fsdp" / "checkpoints" / "iter_9.pt"
    out = tmp_path / "out.pt"
    assert export(capsys, tmp_path / "nope.pt", out) == (
        2,
        f"checkpoint not found: {tmp_path / 'nope.pt'}",
    )
    assert export(capsys, folder, out, "--ema") == (
        2,
        f"--ema: checkpoint {folder} holds no EMA weights (the ema plugin was not on)",
    )
    assert export(capsys, folder, tmp_path) == (
        2,
        f"OUT: {tmp_path} is a folder; name the file to write",
    )
    assert sorted(tmp_path.iterdir()) == []


def test_precise_bn_under_fsdp_gives_the_statistics_it_gives_under_ddp(compared):
    for rank in (0, 1):
        ddp, fsdp = result(compared / "plugins_ddp", rank), result(compared / "plugins_fsdp", rank)
        plain = result(compared / "fsdp", rank)["weights"]
        for name in ("1.running_mean", "1.running_var"):
            torch.testing.assert_close(
                fsdp["weights"][name], ddp["weights"][name], rtol=0, atol=1e-6
            )
            assert not torch.allclose(fsdp["weights"][name], plain[name])  # precise-BN set them
        assert fsdp["metrics"] == pytest.approx(ddp["metrics"], rel=1e-6)


def test_ema_under_fsdp_equals_ema_under_ddp(compared):
    """EMA (decay 0.8, with checkpoint, timer, logger, precise-BN): each rank averages its
    shards; gathered, the average is DDP's to 1e-6 (float rounding; 6e-11 here)."""
    for rank in (0, 1):
        ddp, fsdp = result(compared / "plugins_ddp", rank), result(compared / "plugins_fsdp", rank)
        assert fsdp["ema"].keys() == ddp["ema"].keys() == model().state_dict().keys()
        for name, tensor in ddp["ema"].items():
            torch.testing.assert_close(fsdp["ema"][name], tensor, rtol=0, atol=1e-6)
        moved = (fsdp["ema"]["4.weight"] - fsdp["weights"]["4.weight"]).abs().max()
        assert moved > 1e-3  # an average, not the weights
        # evaluate: both: the pass with the average follows the raw one (whose forward left
        # FSDP's root parameters gathered) and gives DDP's metrics, which differ from the raw
        assert fsdp["metrics"] == pytest.approx(ddp["metrics"], rel=1e-6)
        assert abs(fsdp["metrics"]["ema/loss"] - fsdp["metrics"]["loss"]) > 1e-4
    # the folder holds the average's shards as DCP tensors, state.pt only their shapes
    folder = compared / "plugins_fsdp" / "checkpoints" / "epoch_2.pt"
    state = torch.load(folder / "state.pt", weights_only=True)["plugins"]["ema"]["model"]
    assert state["4.weight"].is_meta and state["4.weight"].shape == (2, 16)
    assert not state["1.running_mean"].is_meta  # a buffer: every rank holds it whole
    metadata = pickle.loads((folder / ".metadata").read_bytes()).state_dict_metadata
    assert "plugins.ema.model.4.weight" in metadata
    # best_accuracy.pt is saved during validation, the average swapped in: it holds the
    # trained weights as its model all the same, as the DDP run's file does
    best = full_model_state(compared / "plugins_fsdp" / "checkpoints" / "best_accuracy.pt")
    file = torch.load(
        compared / "plugins_ddp" / "checkpoints" / "best_accuracy.pt", weights_only=True
    )
    for name, tensor in file["model"].items():
        torch.testing.assert_close(best[name], tensor, rtol=0, atol=1e-6)
    assert not torch.allclose(best["4.weight"], file["plugins"]["ema"]["model"]["4.weight"])


def test_the_ema_state_resumes_exactly_from_a_folder(compared):
    """The plugins' FSDP run resumed from its folder iter_7.pt (mid-epoch) ends with the
    average and weights of the run never interrupted, bit for bit."""
    for rank in (0, 1):
        reference = result(compared / "plugins_fsdp", rank)
        resumed = result(compared / "plugins_resumed", rank)
        assert resumed["resumed_from"].endswith("iter_7.pt")
        for name, tensor in reference["ema"].items():
            assert torch.equal(resumed["ema"][name], tensor), name
        for name, tensor in reference["weights"].items():
            assert torch.equal(resumed["weights"][name], tensor), name
        assert resumed["metrics"] == reference["metrics"]


def test_export_ema_of_a_folder_writes_the_consolidated_average(compared, tmp_path, capsys):
    out = tmp_path / "ema.pt"
    folder = compared / "plugins_fsdp" / "checkpoints" / "epoch_2.pt"
    assert export(capsys, folder, out, "--ema") == (0, "")
    net = model()
    net.load_state_dict(torch.load(out, weights_only=True))  # strict: every key, no more
    final = result(compared / "plugins_fsdp", 0)["ema"]  # gathered by the run itself
    for name, tensor in net.state_dict().items():
        assert torch.equal(tensor, final[name]), name


# plugins that do not work under FSDP yet (strict: one that passes must leave the set)
FSDP_KNOWN_FAILURES: set[str] = set()


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_plugin_keeps_its_conformance_under_two_rank_fsdp(compared, name):
    """hookrun.testing's run-time checks (works alone, state round trip), each plugin
    alone in a 2-rank FSDP run of the conformance toy task (fsdp_job.conformance): it trains
    to the end and a new run loading its sharded folder holds the state rank 0 saved."""
    outcomes = [json.loads((compared / f"conformance_rank{r}.json").read_text()) for r in (0, 1)]
    failures = [f"rank {r}: {o[name]}" for r, o in enumerate(outcomes) if o[name] != "ok"]
    if name in FSDP_KNOWN_FAILURES:  # strict: once it passes, it leaves the set
        assert failures, f"{name} passes under FSDP now: take it out of FSDP_KNOWN_FAILURES"
        pytest.xfail(failures[0])
    assert not failures, failures


def test_nan_guard_skips_a_step_bad_in_one_ranks_shard_on_every_rank(compared):
    """A NaN in rank 1's gradient shard only: the ranks agree (an all-reduce of the flag), so
    both skip that one step and the weights stay finite (fsdp_job.nan_in_one_shard)."""
    for rank in (0, 1):
        outcomes = json.loads((compared / f"conformance_rank{rank}.json").read_text())
        assert outcomes["nan_guard_one_shard"] == "ok", f"rank {rank}"


def test_a_ddp_file_checkpoint_resumes_under_fsdp(compared):
    # iter_9.pt of the DDP run, a file: the FSDP run from it ends with the uninterrupted weights
    for rank in (0, 1):
        reference, resumed = result(compared / "fsdp", rank), result(compared / "from_file", rank)
        assert resumed["resumed_from"] == str(compared / "ddp" / "checkpoints" / "iter_9.pt")
        for name, tensor in reference["weights"].items():
            torch.testing.assert_close(resumed["weights"][name], tensor, rtol=0, atol=1e-6)
        assert resumed["metrics"] == pytest.approx(reference["metrics"], rel=1e-6)


def test_a_file_naming_a_folder_is_still_read_as_a_file(tmp_path, hookrun_isolated):
    """Only the folder loader says where shards are: a file's own 'sharded' entry is no path."""
    task = build()
    task["hooks"] = []
    runner = Runner(**task, max_iters=2, work_dir=tmp_path / "run", writers=())
    runner.train()
    path = runner.save_checkpoint(tmp_path / "last.pt")
    state = torch.load(path, weights_only=True)
    state["sharded"] = str(tmp_path / "elsewhere")  # read as a folder, the load would fail
    torch.save(state, path)
    other = Runner(**build(), work_dir=tmp_path / "other", writers=())
    other.load_checkpoint(path, resume=True)
    for name, tensor in other.unwrapped_model.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def test_a_two_rank_folder_continues_on_three_ranks_and_on_one(
    compared, tmp_path, capsys, hookrun_isolated
):
    """The plugins' run from its 2-rank folder iter_7.pt, saved after 2 of the 5 batches per
    rank of epoch 1, with EMA on: on 3 FSDP ranks and in one process, every sample of that
    epoch the 2 ranks had not used is seen exactly once, and the EMA's average is the saved
    one, resharded (or whole)."""
    folder = compared / "plugins_fsdp" / "checkpoints" / "iter_7.pt"
    before = [result(compared / "plugins_fsdp", rank)["seen"][1] for rank in (0, 1)]
    left = sorted(before[0][8:] + before[1][8:])
    assert len(left) == 24 and len(set(left)) == 24
    saved = tmp_path / "ema_iter_7.pt"
    assert export(capsys, folder, saved, "--ema") == (0, "")
    saved_ema = torch.load(saved, weights_only=True)

    three = tmp_path / "three"
    proc = torchrun(JOB, three, "--resume-from", folder, ranks=3)
    assert "the global batch changes from 8 to 12" in proc.stdout
    ranks = [result(three, rank) for rank in range(3)]
    assert sorted(sum((r["seen"][1] for r in ranks), [])) == left
    for run in ranks:
        assert run["resumed_from"] == str(folder) and run["ema_loaded"].keys() == saved_ema.keys()
        assert all(torch.equal(run["ema_loaded"][k], v) for k, v in saved_ema.items())

    settings = {key: value for key, value in RUN.items() if key != "fsdp"}
    one = Runner(
        **build(), **{**settings, "strategy": "auto"}, work_dir=tmp_path / "one", plugins=EMA_ONLY
    )
    threads = torch.get_num_threads()
    try:
        one.train(resume=folder)
    finally:
        torch.set_num_threads(threads)
    alone = result(tmp_path / "one", 0)
    assert sorted(alone["seen"][1]) == left
    assert all(torch.equal(alone["ema_loaded"][k], v) for k, v in saved_ema.items())

"""The examples of the open training step (docs/training-step.md), run through the real CLI:
the GAN (two optimizers, manual optimization) and the tiny language model (its own loss,
padded batches, accumulation normalised by items). The GAN, with an EMA of its generator, is
SIGKILLed after its first checkpoint and resumed with ``--resume auto``; it must end bit for
bit where a run never interrupted ends."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import torch

from _support import ROOT, clean_env, hookrun_script, run
from hookrun.testing import assert_same_checkpoint, forked, load_checkpoint

GAN = ROOT / "examples" / "gan" / "config.yaml"
LM = ROOT / "examples" / "language_model" / "config.yaml"
# a shorter GAN run saving every epoch: the first save comes after 29 of 290 iterations
GAN_SHORT = ("--set", "runner.max_epochs=10", "--set", "plugins.checkpoint.interval=1")


def records(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]


def start_gan(work: Path, *extra: str) -> subprocess.Popen:
    return forked.spawn(
        [hookrun_script(), "train", str(GAN), "--work-dir", str(work), *GAN_SHORT, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


def test_gan_killed_after_a_checkpoint_resumes_bit_for_bit(tmp_path: Path) -> None:
    whole = start_gan(tmp_path / "whole")  # the run never interrupted, alongside
    cut = start_gan(tmp_path / "cut")
    first = tmp_path / "cut" / "checkpoints" / "epoch_1.pt"
    deadline = time.monotonic() + 300
    while not first.exists() and cut.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert first.exists(), cut.communicate()[1]
    os.kill(cut.pid, signal.SIGKILL)
    assert cut.wait() == -signal.SIGKILL  # killed mid-run, not after it ended
    assert not (tmp_path / "cut" / "checkpoints" / "epoch_10.pt").exists()

    resumed = run("train", GAN, "--work-dir", tmp_path / "cut", *GAN_SHORT, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert "resum" in resumed.stdout + resumed.stderr
    assert whole.wait() == 0, whole.communicate()[1]

    end_whole = tmp_path / "whole" / "checkpoints" / "epoch_10.pt"
    end_resumed = tmp_path / "cut" / "checkpoints" / "epoch_10.pt"
    # every tensor bit for bit: both submodules' weights, both optimizers' states, the RNGs
    assert_same_checkpoint(end_whole, end_resumed)
    state = load_checkpoint(end_resumed)
    assert set(state["optimizers"]) == {"generator", "discriminator"}
    assert state["loop"]["optimizer_steps"] == {"generator": 290, "discriminator": 290}
    assert {k.split(".")[0] for k in state["model"]} == {"generator", "discriminator"}
    ema = state["plugins"]["ema"]  # the generator's average: one update per generator step
    assert ema["updates"] == ema["steps"] == 290
    weights, average = state["model"], ema["model"]
    assert all(torch.equal(average[k], v) for k, v in weights.items() if "discriminator" in k)
    assert not all(torch.equal(average[k], v) for k, v in weights.items() if "generator" in k)

    logged = [r for r in records(tmp_path / "whole") if "train/d_loss" in r]
    assert set(range(10, 291, 10)) <= {r["step"] for r in logged}
    assert all(
        math.isfinite(r["train/d_loss"]) and math.isfinite(r["train/g_loss"]) for r in logged
    )


def test_language_model_trains_from_padded_batches_on_its_own_loss(tmp_path: Path) -> None:
    work = tmp_path / "lm"
    result = run("train", LM, "--work-dir", work)
    assert result.returncode == 0, result.stderr
    logged = records(work)
    train = [r for r in logged if "train/loss" in r]
    # 6 epochs of 64 batches, logged every 16 iterations (4 optimizer steps of grad_accum 4)
    assert [r["step"] for r in train] == list(range(16, 385, 16))
    assert train[-1]["train/loss"] < 0.5 * train[0]["train/loss"]
    assert all(r["train/num_items"] > 8 for r in train)  # the label tokens the model reported
    val = [r for r in logged if "val/loss" in r]
    assert [r["step"] for r in val] == [128, 256, 384]  # the model's own loss, validated
    assert val[-1]["val/loss"] < val[0]["val/loss"]
    assert val[-1]["val/next_char_accuracy"] > 0.6

    checkpoints = work / "checkpoints"
    assert {"epoch_4.pt", "epoch_6.pt", "best_loss.pt"} <= {p.name for p in checkpoints.iterdir()}
    state = load_checkpoint(checkpoints / "epoch_6.pt")
    assert state["loop"]["optimizer_steps"] == {"main": 96}  # 384 batches in groups of 4

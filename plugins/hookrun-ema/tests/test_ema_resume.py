"""A run killed with SIGKILL and resumed ends with the same average, bit for bit."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from ema_testing import bn_mlp, resume_job
from hookrun_ema import EMA, EMASettings

from hookrun.testing import forked

SCRIPT = """
import sys
import torch
from ema_testing import resume_job

torch.set_num_threads(1)
work_dir, kill_at, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.save(resume_job(work_dir, kill_at), out)
"""


def run(tmp_path: Path, kill_at: int) -> int:
    """The job in a fresh process, killed after iteration ``kill_at`` (-1: never)."""
    env = dict(os.environ, HOOKRUN_PLUGINS_AUTOLOAD="0", OMP_NUM_THREADS="1")
    here = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    args = [str(tmp_path / "job.py"), str(tmp_path / "killed"), str(kill_at)]
    command = [sys.executable, *args, str(tmp_path / "resumed.pt")]
    return forked.run(command, env=env, timeout=120).returncode


def flat(state: dict) -> dict[str, object]:
    """Every leaf of a nested state, by dotted path."""
    if not isinstance(state, dict):
        return {"": state}
    return {f"{k}.{p}".rstrip("."): v for k, sub in state.items() for p, v in flat(sub).items()}


def test_sigkill_and_resume_continue_the_average_bit_for_bit(tmp_path) -> None:
    """Float32 and bfloat16 weights in one model; the kill falls between checkpoints and
    between two updates (update_interval 2), after start_iter."""
    (tmp_path / "job.py").write_text(SCRIPT)
    straight = flat(resume_job(str(tmp_path / "straight")))  # never interrupted, in this process
    assert run(tmp_path, kill_at=12) == -signal.SIGKILL
    saved = sorted(p.name for p in (tmp_path / "killed/checkpoints").iterdir())
    assert saved == ["iter_10.pt", "iter_5.pt"]
    assert run(tmp_path, kill_at=-1) == 0
    resumed = flat(torch.load(tmp_path / "resumed.pt", weights_only=True))
    assert straight.keys() == resumed.keys()
    assert straight["ema.updates"] == (24 - 4) // 2 + 1
    assert straight["ema.shadow.tail.0.weight"].dtype == torch.float32  # travels for resume
    assert "ema.shadow.head.0.weight" not in straight  # float32 entries are not stored twice
    for key, value in straight.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed[key]), key
        else:
            assert value == resumed[key], key


def test_state_loaded_before_the_model_was_seen_waits_for_it() -> None:
    """`hookrun val --checkpoint` loads plugin states before the run starts."""
    source = EMA(EMASettings(decay=0.5))
    model = bn_mlp()
    source._shadow_of(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    source.shadow.update(0.5)  # type: ignore[union-attr]
    source.updates = 1
    state = source.state_dict()
    target = EMA(EMASettings())
    target.load_state_dict(state)
    assert target.shadow is None  # no model to put it in yet
    target._shadow_of(bn_mlp())
    assert target.updates == 1
    for key, value in state["model"].items():
        assert torch.equal(target.state_dict()["model"][key], value), key

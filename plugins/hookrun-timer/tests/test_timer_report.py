"""The end-of-training summary, the hook profile (console and JSONL) and totals across resume."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import torch

from hookrun import ConfigError, PluginError, hookimpl

SPEED = re.compile(
    r"\[hookrun\] Overall training speed: (\d+) iterations in (\d+:\d\d:\d\d) \(([\d.]+) ms/it\)"
)
TOTAL = re.compile(r"\[hookrun\] Total training time: (\d+:\d\d:\d\d) \((\d+:\d\d:\d\d) on hooks\)")

# hook points fired after before_run in a training run without resume (after_run is still
# running when the profile is printed)
FIRED = {
    "before_train",
    "before_train_epoch",
    "before_train_iter",
    "after_train_iter",
    "after_train_epoch",
    "before_val",
    "before_val_epoch",
    "before_val_iter",
    "after_val_iter",
    "after_val_epoch",
    "after_val",
    "after_train",
}


class SlowHook:
    """Spends ``delay`` seconds in every after_train_iter and keeps the time it really spent
    (a reference that holds on a busy machine, where sleeps overshoot)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: list[float] = []

    @hookimpl
    def after_train_iter(self) -> None:
        start = time.perf_counter()
        time.sleep(self.delay)
        self.calls.append(time.perf_counter() - start)

    @property
    def spent(self) -> float:
        return sum(self.calls)


class EpochHook:
    """A cheap hook at epoch and validation boundaries."""

    priority = 70

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def after_train_epoch(self) -> None:
        self.seen.append("epoch")

    @hookimpl
    def before_val_iter(self, batch_idx: int) -> None:
        self.seen.append(f"val{batch_idx}")


class SaveAndStop:
    """Saves a checkpoint after ``at`` iterations and stops: an interrupted run."""

    priority = 100

    def __init__(self, at: int, path: Any) -> None:
        self.at = at
        self.path = path

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.at:
            runner.save_checkpoint(self.path)
            runner.stop_training = True


def seconds(hms: str) -> int:
    h, m, s = (int(part) for part in hms.split(":"))
    return 3600 * h + 60 * m + s


@pytest.mark.timing
def test_final_lines_report_speed_and_time_in_hooks(make_runner: Any) -> None:
    slow = SlowHook(0.03)
    runner = make_runner({"warmup": 4}, data=0.01, step=0.01, batches=30, hooks=[slow])
    start = time.perf_counter()
    runner.train()
    wall = time.perf_counter() - start
    out = runner.console.file.getvalue()
    speed, total = SPEED.search(out), TOTAL.search(out)
    assert speed and total, out
    assert int(speed[1]) == 30 - 4
    assert float(speed[3]) == pytest.approx(10 + 10 + 30, rel=0.3)  # ms
    assert abs(seconds(total[1]) - wall) <= 0.6
    assert seconds(total[2]) == round(slow.spent) == 1  # 30 x 30 ms in SlowHook
    hooks = runner.plugins["timer"].state_dict()["totals"]["hooks"]
    assert slow.spent <= hooks <= 1.3 * slow.spent


def test_profile_lists_every_plugin_at_every_hook_point(make_runner: Any) -> None:
    slow, epochs = SlowHook(0.003), EpochHook()
    runner = make_runner(
        {"profile_hooks": True},
        batches=6,
        val_batches=2,
        max_epochs=2,
        hooks=[slow, epochs],
        writers=("jsonl",),
    )
    runner.train()
    records = [json.loads(line) for line in (runner.work_dir / "log.jsonl").open()]
    profiles = [r["hook_profile"] for r in records if "hook_profile" in r]
    assert len(profiles) == 1
    rows = profiles[0]
    table = runner.manager.table()
    expected = {(owner, hook) for hook, owners in table if hook in FIRED for owner in owners}
    assert {(row["plugin"], row["hook"]) for row in rows} == expected
    assert {"timer", "SlowHook", "EpochHook"} == {row["plugin"] for row in rows}
    assert all(row["total_s"] > 0 for row in rows)
    calls = {(row["plugin"], row["hook"]): row["calls"] for row in rows}
    assert calls[("SlowHook", "after_train_iter")] == 12
    assert calls[("EpochHook", "before_val_iter")] == 4
    assert calls[("timer", "before_train")] == 1
    # slowest first, on the console too
    assert rows[0]["plugin"] == "SlowHook" and rows[0]["total_s"] >= 12 * 0.003
    console = runner.console.file.getvalue()
    assert "Time in hooks" in console
    lines = [line for line in console.splitlines() if "SlowHook" in line or "EpochHook" in line]
    assert "SlowHook" in lines[0] and "after_train_iter" in lines[0]
    assert runner.hook_stats.profile is False  # switched off again after the run


def test_no_profile_table_by_default(make_runner: Any) -> None:
    runner = make_runner(batches=6, writers=("jsonl",))
    runner.train()
    assert "Time in hooks" not in runner.console.file.getvalue()
    assert "hook_profile" not in (runner.work_dir / "log.jsonl").read_text()
    assert runner.hook_stats.per_hook == {}


def test_resumed_run_reports_totals_of_the_whole_run(make_runner: Any, tmp_path: Any) -> None:
    path = tmp_path / "interrupted.pt"
    slow = SlowHook(0.01)
    first = make_runner(
        {"warmup": 2, "profile_hooks": True},
        data=0.004,
        step=0.016,
        batches=20,
        hooks=[SaveAndStop(12, path), slow],
    )
    first.train()
    saved = torch.load(path, weights_only=True)["plugins"]["timer"]
    assert saved["totals"]["iters"] == 12
    second = make_runner(
        {"warmup": 2, "profile_hooks": True},
        data=0.004,
        step=0.016,
        batches=20,
        hooks=[slow],
    )
    start = time.perf_counter()
    second.train(resume=path)
    wall = time.perf_counter() - start
    out = second.console.file.getvalue()
    speed = SPEED.search(out)
    assert speed, out
    assert int(speed[1]) == (12 - 2) + (8 - 2)  # each process warms up
    totals = second.plugins["timer"].state_dict()["totals"]
    assert totals["iters"] == 20
    assert totals["elapsed"] == pytest.approx(saved["totals"]["elapsed"] + wall, rel=0.05)
    # both runs' hooks, less the hook call in progress when the checkpoint was taken
    hooks_reference = slow.spent - slow.calls[11]
    assert hooks_reference <= totals["hooks"] <= 1.3 * hooks_reference
    profile = {(p, h): c for p, h, c, _ in second.plugins["timer"].state_dict()["hook_profile"]}
    assert profile[("SlowHook", "after_train_iter")] == 20


def test_val_and_test_alone_print_nothing(make_runner: Any) -> None:
    runner = make_runner(batches=4, val_batches=2)
    runner.val()
    assert "training speed" not in runner.console.file.getvalue()
    runner.train()
    runner.val()
    assert runner.console.file.getvalue().count("Overall training speed") == 1


def test_cuda_events_true_without_cuda_is_a_config_error(make_runner: Any) -> None:
    runner = make_runner({"cuda_events": True}, batches=2)
    with pytest.raises(ConfigError, match=r"^plugins\.timer\.cuda_events: true needs a CUDA"):
        runner.train()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"warmup": -1}, r"plugins\.timer\.warmup: Input should be greater than or equal to 0"),
        ({"window": 0}, r"plugins\.timer\.window: Input should be greater than or equal to 1"),
        ({"cuda_events": "sometimes"}, r"plugins\.timer\.cuda_events"),
        ({"profile": True}, r"plugins\.timer\.profile: unknown setting"),
    ],
)
def test_bad_settings_name_the_field(make_runner: Any, settings: dict, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        make_runner(settings)


class FailAt:
    """Raises in after_train_iter of iteration ``at``; keeps the timer state an emergency
    checkpoint would save."""

    priority = 90

    def __init__(self, at: int) -> None:
        self.at = at
        self.saved: dict[str, Any] = {}

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        if runner.iter + 1 == self.at:
            raise RuntimeError("boom")

    @hookimpl
    def on_exception(self, runner: Any) -> None:
        self.saved = runner.checkpoint_state()["plugins"]["timer"]


def test_exception_keeps_totals_and_stops_profiling(make_runner: Any) -> None:
    fail = FailAt(5)
    runner = make_runner({"warmup": 1, "profile_hooks": True}, batches=8, hooks=[fail])
    with pytest.raises(RuntimeError, match="boom"):
        runner.train()
    assert fail.saved["totals"]["iters"] == 5
    assert fail.saved["totals"]["elapsed"] >= 5 * (0.004 + 0.008)
    assert runner.hook_stats.profile is False
    assert "training speed" not in runner.console.file.getvalue()


class CriticAndGenerator(torch.nn.Module):
    """Manual optimization: the critic steps every iteration, the generator every second."""

    def __init__(self) -> None:
        super().__init__()
        self.critic, self.generator = torch.nn.Linear(4, 1), torch.nn.Linear(4, 4)
        self.calls = 0

    def training_step(self, batch: torch.Tensor, optim: Any) -> torch.Tensor:
        loss = self.critic(self.generator(batch)).square().mean()
        optim.backward(loss)
        optim.step("critic")
        self.calls += 1
        if self.calls % 2 == 0:
            loss = self.critic(self.generator(batch)).mean()
            optim.backward(loss)
            optim.step("generator")
        return loss.detach()


def test_several_optimizers_get_their_step_counts_in_the_summary(make_runner: Any) -> None:
    model = CriticAndGenerator()
    optimizers = {
        "critic": torch.optim.SGD(model.critic.parameters(), lr=0.01),
        "generator": torch.optim.SGD(model.generator.parameters(), lr=0.01),
    }
    runner = make_runner(batches=8, model=model, optimizer=optimizers)
    runner.train()
    lines = [line for line in runner.console.file.getvalue().splitlines() if "Optimizer" in line]
    assert len(lines) == 1, lines
    found = re.fullmatch(
        r"\[hookrun\] Optimizer steps: critic 8 \((\d+\.\d)/s\), generator 4 \((\d+\.\d)/s\)",
        lines[0],
    )
    assert found, lines[0]
    seconds = runner.plugins["timer"].state_dict()["totals"]["seconds"]
    assert float(found[1]) == pytest.approx(8 / seconds, abs=0.06)
    assert float(found[2]) == pytest.approx(4 / seconds, abs=0.06)

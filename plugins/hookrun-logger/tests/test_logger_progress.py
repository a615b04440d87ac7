"""Console output in both modes: plain lines for logs and pipes, a clock-driven bar on a tty."""

from __future__ import annotations

import io
import re
import time

import pytest
import torch
from rich.console import Console
from torch.utils.data import DataLoader, TensorDataset

from hookrun import ConfigError, format_duration, hookimpl


def console(terminal: bool) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=160, color_system=None)


def output(runner) -> str:
    return runner.console.file.getvalue()


LINE = re.compile(r"^epoch (\d)/2  iter (\d+)/50  loss (\S+)  ce (\S+)  l2 (\S+)  lr (\S+)  ", re.M)


def test_lines_mode_prints_the_core_reports_every_interval(make_runner, recorder):
    runner = make_runner({"interval": 10}, hooks=[recorder], log_interval=5)
    runner.console = console(terminal=False)  # progress: auto -> lines
    runner.train()
    text = output(runner)
    lines = LINE.findall(text)
    assert [int(m[1]) for m in lines] == [10, 20, 30, 40, 50]
    assert [int(m[0]) for m in lines] == [1, 1, 2, 2, 2]
    for _epoch, step, loss, ce, l2, lr in lines:
        step = int(step)  # the core's report averages the 5 iterations since the last one
        assert loss == f"{recorder.mean('loss', step - 5, step):.4g}"
        assert ce == f"{recorder.mean('ce', step - 5, step):.4g}"
        assert l2 == f"{recorder.mean('l2', step - 5, step):.4g}"
        assert lr == "5.000e-02"
    assert "\x1b[" not in text  # no cursor movement or colour in a log file
    assert "it/s ETA" not in text  # no bar frame


def test_lines_show_the_reported_eta(make_runner):
    reported = {}

    class Peek:
        @hookimpl
        def after_report(self, scalars, step):
            reported[step] = scalars["train/eta"]

    runner = make_runner({"interval": 10}, hooks=[Peek()])
    runner.console = console(terminal=False)
    runner.train()
    etas = re.findall(r"iter (\d+)/50 .* eta (\d+:\d\d:\d\d)", output(runner))
    assert etas == [(str(s), format_duration(reported[s])) for s in (10, 20, 30, 40, 50)]


@pytest.mark.timing
def test_the_speed_on_a_line_leaves_validation_out(make_runner):
    """The line after a validation shows the training speed, as the core's own line does:
    the validation (4 batches of 40 ms, at iteration 25) between the lines at 20 and 30 does
    not count as training time (it would cut that line's speed about tenfold)."""

    class Sleeps:
        @hookimpl
        def after_train_iter(self):
            time.sleep(0.002)

        @hookimpl
        def after_val_iter(self):
            time.sleep(0.040)

    runner = make_runner({"interval": 10, "progress": "lines"}, hooks=[Sleeps()])
    runner.console = console(terminal=False)
    runner.train()
    speeds = dict(re.findall(r"iter (\d+)/50 .*  (\S+) it/s", output(runner)))
    assert sorted(speeds, key=int) == ["10", "20", "30", "40", "50"]
    others = [float(speeds[step]) for step in ("10", "20", "40")]
    assert float(speeds["30"]) > 0.5 * min(others), speeds


def test_interval_must_be_a_multiple_of_the_log_interval(make_runner):
    runner = make_runner({"interval": 15}, log_interval=10)
    with pytest.raises(ConfigError, match=r"plugins.logger.interval: 15 is not a multiple"):
        runner.train()


def test_one_metrics_line_after_each_validation(make_runner):
    runner = make_runner({"interval": 10, "progress": "off"})
    runner.console = console(terminal=False)
    runner.train()
    text = output(runner)
    assert "iter 10/50" not in text  # progress off: no interval lines
    metrics = runner.last_metrics["val"]
    assert re.findall(r"^val  .*$", text, re.M)[1:] == [
        f"val  epoch 2  iter 50  loss {metrics['loss']:.4g}  accuracy {metrics['accuracy']:.4g}"
    ]
    assert re.findall(r"^val  epoch (\d)  iter (\d+)  loss ", text, re.M) == [
        ("1", "25"),
        ("2", "50"),
    ]
    assert "│" not in text  # no table


def test_a_test_run_prints_its_line(make_runner):
    data = TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
    runner = make_runner({"progress": "lines"}, test_dataloader=DataLoader(data, batch_size=4))
    runner.console = console(terminal=False)
    metrics = runner.test()
    text = output(runner)
    assert f"test  iter 0  loss {metrics['loss']:.4g}  accuracy {metrics['accuracy']:.4g}\n" in text


def test_log_val_iters_lines(make_runner):
    runner = make_runner(
        {"interval": 2, "log_val_iters": True, "progress": "lines"}, max_epochs=1, log_interval=2
    )
    runner.console = console(terminal=False)
    runner.train()
    assert re.findall(r"^val \[(\d+)/4\]", output(runner), re.M) == ["2", "4"]


class Slow:
    """Makes each iteration last about a millisecond, so the run spans several redraws."""

    @hookimpl
    def after_train_iter(self) -> None:
        time.sleep(0.0015)


@pytest.mark.timing
def test_bar_on_a_terminal_is_redrawn_by_time_not_by_iteration(make_runner):
    runner = make_runner(
        {"interval": 10, "refresh_per_second": 4},
        hooks=[Slow()],
        max_epochs=8,
        val_dataloader=None,  # printed tables redraw the bar too; keep only clock redraws
    )
    runner.console = console(terminal=True)  # progress: auto -> bar
    start = time.perf_counter()
    runner.train()  # 200 iterations
    elapsed = time.perf_counter() - start
    text = output(runner)
    frames = text.count(" it/s ")
    assert 1 <= frames <= elapsed * 4 + 3 < 200
    assert "\x1b[?25h" in text  # cursor shown again: the bar was stopped
    final = text.rsplit("epoch 8/8", 1)[1]
    bar = r" ━+ 200/200 loss \d\.\d{1,4} lr 5\.000e-02 [\d.]+ it/s ETA \d:\d\d:\d\d"
    assert re.match(bar, final)
    assert not LINE.search(text)  # no per-interval lines under a bar


@pytest.mark.timing
def test_the_bar_speed_leaves_validation_out(make_runner):
    """The bar's it/s is the training speed, as on the lines: the two validations (4 batches
    of 50 ms each, at iterations 25 and 50) do not count as training time. With 4 ms
    iterations the last frame shows 160-190 it/s here (checkpoints and hooks count), 76 with
    the validations counted in."""

    class Sleeps:
        @hookimpl
        def after_train_iter(self):
            time.sleep(0.004)

        @hookimpl
        def after_val_iter(self):
            time.sleep(0.050)

    runner = make_runner({"interval": 10, "refresh_per_second": 20}, hooks=[Sleeps()])
    runner.console = console(terminal=True)  # progress: auto -> bar
    runner.train()
    final = output(runner).rsplit("epoch 2/2", 1)[1]
    speed = float(re.search(r" 50/50 .* ([\d.]+) it/s ETA", final).group(1))
    assert speed > 120, final


def test_bar_shows_validation_rows_when_asked(make_runner):
    seen = []

    class Peek:
        priority = 100  # after the logger has counted the batch

        @hookimpl
        def after_val_iter(self, runner, batch_idx):
            if batch_idx == 2:
                seen.append(runner.console.file.getvalue())
                runner.plugins["logger"].live.refresh()
                seen.append(runner.console.file.getvalue())

    runner = make_runner(
        {"interval": 5, "log_val_iters": True, "progress": "bar"},
        max_epochs=1,
        hooks=[Peek()],
        log_interval=5,
    )
    runner.console = console(terminal=True)
    runner.train()
    assert re.search(r"\nval ━+╸? +3/4$", seen[1][len(seen[0]) :])


@pytest.mark.parametrize("when", ["iteration", "validation"])
def test_bar_is_stopped_when_training_fails(make_runner, when):
    class Boom:
        @hookimpl
        def after_train_iter(self, runner):
            self.live = runner.plugins["logger"].live
            if when == "iteration" and runner.iter == 7:
                raise RuntimeError("boom")

        @hookimpl
        def after_val_iter(self):
            raise RuntimeError("boom")

    boom = Boom()
    runner = make_runner({"progress": "bar", "log_val_iters": True}, hooks=[boom])
    runner.console = console(terminal=True)
    with pytest.raises(RuntimeError, match="boom"):
        runner.train()
    assert boom.live is not None and not boom.live.is_started
    assert runner.plugins["logger"].live is None
    assert output(runner).endswith("\x1b[?25h")
    runner.console.print("after")  # the console works normally again
    assert output(runner).endswith("after\n")


def test_bar_stopped_after_a_normal_run_and_nothing_on_other_modes(make_runner):
    runner = make_runner({"progress": "bar"})
    runner.console = console(terminal=True)
    runner.train()
    assert runner.plugins["logger"].live is None
    before = output(runner)
    runner.val()  # no bar for a val() call without log_val_iters, just the table
    after = output(runner)[len(before) :]
    assert "it/s" not in after and "val  epoch 2  iter 50  loss " in after

"""Settings: validated with field paths, every field described, readable without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hookrun_logger import Logger, LoggerSettings

from hookrun import PluginError


def test_invalid_settings_are_reported_by_field(make_runner):
    with pytest.raises(PluginError) as info:
        make_runner({"interval": 0, "progress": "bars", "refresh_per_second": 0})
    lines = str(info.value).splitlines()
    assert "plugins.logger.interval: Input should be greater than or equal to 1 (got 0)" in lines
    assert any(line.startswith("plugins.logger.progress:") and "'bars'" in line for line in lines)
    assert any(line.startswith("plugins.logger.refresh_per_second:") for line in lines)


def test_defaults_and_metadata():
    settings = LoggerSettings()
    assert (settings.interval, settings.progress) == (None, "auto")
    assert (settings.refresh_per_second, settings.log_val_iters) == (4.0, False)
    assert all(field.description for field in LoggerSettings.model_fields.values())
    assert (Logger.name, int(Logger.priority), Logger.enabled_by_default) == ("logger", 60, True)


def test_reading_the_settings_does_not_import_torch():
    code = "import sys, hookrun_logger as m; m.LoggerSettings(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""Bad settings fail before training, one line naming the field."""

from __future__ import annotations

import pytest
import torch

from hookrun import PluginError, Runner

BAD = {
    "decay": (1.5, "plugins.ema.decay: Input should be less than 1 (got 1.5)"),
    "update_interval": (0, "plugins.ema.update_interval: Input should be greater than or equal"),
    "start_iter": (-1, "plugins.ema.start_iter: Input should be greater than or equal to 0"),
    "buffers": ("avg", "plugins.ema.buffers: Input should be 'copy' or 'average' (got 'avg')"),
    "device": ("cuda", "plugins.ema.device: Input should be 'cpu' (got 'cuda')"),
    "evaluate": ("x", "plugins.ema.evaluate: Input should be 'ema', 'raw' or 'both' (got 'x')"),
    "decai": (0.9, "plugins.ema.decai: unknown setting (did you mean 'decay'?)"),
}


@pytest.mark.parametrize("field", BAD)
def test_bad_setting_is_one_line_naming_the_field(field: str, tmp_path) -> None:
    value, message = BAD[field]
    with pytest.raises(PluginError) as info:
        Runner(
            torch.nn.Linear(2, 2),
            criterion=torch.nn.MSELoss(),
            plugins={"ema": {field: value}},
            work_dir=tmp_path,
            writers=(),
        )
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(message)

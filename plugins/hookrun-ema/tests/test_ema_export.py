"""``hookrun export --ema`` writes what ``EMA.export_weights`` finds in the checkpoint: the
core knows the plugin's method, not how the plugin lays out its state."""

from __future__ import annotations

import torch
from hookrun_ema import EMA

from hookrun import Runner
from hookrun.testing import load_checkpoint, run_cli, toy_runner_kwargs


def test_export_ema_writes_the_average_the_plugin_exports(tmp_path, capsys, monkeypatch) -> None:
    runner = Runner(**toy_runner_kwargs(tmp_path / "run", plugins={"ema": {"decay": 0.5}}))
    runner.train()
    checkpoint = tmp_path / "c.pt"
    runner.save_checkpoint(checkpoint)
    saved = load_checkpoint(checkpoint)
    average = saved["plugins"]["ema"]["model"]
    assert any(not torch.equal(average[k], saved["model"][k]) for k in average)

    out = tmp_path / "ema.pt"
    assert run_cli(capsys, "export", checkpoint, out, "--ema")[0] == 0
    exported = torch.load(out, weights_only=True)
    assert exported.keys() == average.keys()
    assert all(torch.equal(exported[k], average[k]) for k in average)

    # the core asks the plugin: an EMA that exports nothing leaves nothing to export
    monkeypatch.setattr(EMA, "export_weights", classmethod(lambda cls, state: None))
    code, out_text, err = run_cli(capsys, "export", checkpoint, tmp_path / "none.pt", "--ema")
    assert (code, out_text) == (2, "")
    assert err.strip() == (
        f"--ema: checkpoint {checkpoint} holds no EMA weights (the ema plugin was not on)"
    )
    assert not (tmp_path / "none.pt").exists()

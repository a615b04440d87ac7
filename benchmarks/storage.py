"""Checkpoint save and load time by where the checkpoint goes: local disk, ``memory://`` and
S3 (a local moto server, ``python -m moto.server`` on 127.0.0.1, started by this script).

State: an MLP of ``PARAMS`` parameters (fp32) with AdamW state after one step: weights plus
two moments, about ``3 * 4 * PARAMS`` bytes. Each location is written and read ``REPEATS``
times with the functions every save and resume of hookrun goes through
(``hookrun.checkpoint.files.write`` and ``load``): on local disk the atomic write (temporary
file, fsync, rename, folder fsync), at a URL ``torch.save`` into memory and one whole upload
(s3fs sends an object over 100 MiB as a multipart upload, which S3 shows only once
complete). The median is printed. The moto server keeps its objects in memory and runs on
the same machine, so the S3 figure is hookrun's and s3fs's cost plus HTTP on loopback, not
a network's.

    python benchmarks/storage.py           # needs moto[server] and s3fs for the S3 row
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HOOKRUN_PLUGINS_AUTOLOAD", "0")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hookrun import URL  # noqa: E402
from hookrun.checkpoint import files  # noqa: E402

PARAMS = 8_000_000
REPEATS = 5


def state() -> dict[str, Any]:
    """A hookrun/1-shaped state: model and AdamW state after one step."""
    torch.manual_seed(0)
    width = 2000
    layers = PARAMS // (width * width)
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return {
        "format": files.FORMAT,
        "model": model.state_dict(),
        "optimizers": {"main": optimizer.state_dict()},
    }


def median_ms(action: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def moto_server() -> tuple[subprocess.Popen[bytes], str] | None:
    """moto's S3 server on a free port, with the environment s3fs reads set; None when
    moto or s3fs is not installed."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return server, endpoint


def main() -> None:
    torch.set_num_threads(1)
    saved = state()
    size = sum(t.numel() * t.element_size() for t in _tensors(saved)) / 2**20
    print(f"state: {size:.0f} MiB of tensors; median of {REPEATS}")
    print(f"{'where':<12} {'save ms':>9} {'load ms':>9}")
    with tempfile.TemporaryDirectory() as folder:
        places: list[tuple[str, Path | URL]] = [("local disk", Path(folder) / "c.pt")]
        places.append(("memory://", URL("memory://bench/c.pt")))
        server = moto_server()
        if server is not None:
            bucket = URL("s3://bench/c.pt")
            bucket.fs.mkdir("bench")
            places.append(("s3 (moto)", bucket))
        try:
            for name, where in places:
                save = median_ms(lambda at=where: files.write(saved, at))  # type: ignore[misc]
                load = median_ms(lambda at=where: files.load(at))  # type: ignore[misc]
                print(f"{name:<12} {save:>9.1f} {load:>9.1f}")
            if server is None:
                print("s3 (moto)    skipped: pip install 'moto[server]' s3fs")
        finally:
            if server is not None:
                server[0].terminate()
                server[0].wait()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    if isinstance(obj, (list, tuple)):
        return [t for value in obj for t in _tensors(value)]
    return []


if __name__ == "__main__":
    main()

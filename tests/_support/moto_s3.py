"""A real S3-compatible server for the checkpoint storage tests: moto's server mode
(``python -m moto.server``) in a subprocess on 127.0.0.1, found by s3fs through the
environment: ``AWS_ENDPOINT_URL`` (botocore honours it for every client) and dummy
credentials. Nothing leaves the machine."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hookrun.testing import free_port


@dataclass
class S3Server:
    """The running server: its endpoint, and the environment a process needs to reach it."""

    endpoint: str
    env: dict[str, str]


def s3_env(endpoint: str) -> dict[str, str]:
    """What s3fs (through botocore) reads to reach ``endpoint`` with dummy credentials."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",  # an unreachable endpoint is one line at once, not retried
    }


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[S3Server]:
    """moto's S3 server for one test module: started, waited for until it answers, its
    endpoint and credentials put in this process's environment (so subprocesses inherit
    them), stopped and the environment put back at the end."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {endpoint}") from None
                time.sleep(0.1)
        env = s3_env(endpoint)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            yield S3Server(endpoint, env)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def s3_filesystem() -> object:
    """A fresh s3fs file system on the environment's endpoint (no cached instance, no
    cached listing)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)

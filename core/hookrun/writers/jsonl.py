"""The built-in ``jsonl`` writer: the run's machine-readable log, one JSON object a line."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookrun.engine.workdir_files import check_no_links
from hookrun.engine.workdir_hold import open_for_writing
from hookrun.writers.base import Writer

#: ``json.dumps(record, default=str)`` without building an encoder for every line
_JSON = json.JSONEncoder(default=str)


class JsonlWriter(Writer):
    """One JSON object per line in ``<work_dir>/log.jsonl``: the machine-readable log."""

    def __init__(self, work_dir: str | Path, filename: str = "log.jsonl") -> None:
        super().__init__(work_dir)
        self.path = self.work_dir / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_no_links(self.work_dir, self.path.parent)
        fd = open_for_writing(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)  # a crash loses no line

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step, "time": round(time.time(), 3)}
        for name, number in scalars.items():  # NaN and infinities as strings: valid JSON
            number = float(number)
            record[name] = number if math.isfinite(number) else str(number)
        self._write(record)

    def write_config(self, config: Mapping[str, Any]) -> None:
        self._write({"config": config, "time": round(time.time(), 3)})

    def write_record(self, record: Mapping[str, Any]) -> None:
        """Any other JSON record (tables, summaries)."""
        self._write(dict(record))

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(_JSON.encode(record) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

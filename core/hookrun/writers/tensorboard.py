"""The built-in ``tensorboard`` writer: event files written in the calling thread, with an
HParams session of the config and the final metrics at the run's end."""

from __future__ import annotations

import itertools
import json
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hookrun.engine.workdir_files import check_no_links
from hookrun.engine.workdir_hold import open_for_writing
from hookrun.writers.base import Writer, image_uint8

#: numbers the event files this process opens, so two opened in the same second differ
_OPENED = itertools.count()


class TensorBoardWriter(Writer):
    """TensorBoard event files in ``<work_dir>/tensorboard``, built from tensorboardX's summary
    protos and framed as TFRecords (checksums by ``google-crc32c``, in C: tensorboardX's own
    CRC-32C is pure Python, ~30 µs an event).

    Each ``write_scalars`` call is one event holding every value, written in the calling
    thread and handed to the OS at once, so TensorBoard shows every interval as soon as it is
    logged; ``flush()`` and ``close()`` also fsync. tensorboardX's ``SummaryWriter`` sends
    every value through a ``multiprocessing.Queue`` to helper threads whose pickling and
    writing take the GIL while training runs, and shows them up to ``flush_secs`` late; here
    nothing runs in the background (docs/benchmarks.md).
    """

    def __init__(self, work_dir: str | Path, subdir: str = "tensorboard") -> None:
        super().__init__(work_dir)
        # imported with the first writer, not with hookrun (start-up stays light)
        from google_crc32c import value as crc32c
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        self._event, self._summary, self._crc32c = Event, Summary, crc32c
        self.log_dir = self.work_dir / subdir
        check_no_links(self.work_dir, self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # the pid and a counter keep two writers opened in the same second (train, then test)
        # from sharing a file
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.path = self.log_dir / f"{name}.{os.getpid()}.{next(_OPENED)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self._file = os.fdopen(open_for_writing(self.path, flags), "wb")
        self._tags: dict[str, str] = {}
        self._hparams: dict[str, Any] = {}  # the config's values, for the HParams tab
        self._final: dict[str, float] = {}  # the last val/ and test/ values, its metrics
        self._wrote_scalars = False  # a pass that logged nothing has no session to show
        self._write_event(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        tags, value = self._tags, self._summary.Value
        values = [
            value(tag=tags.get(name) or self._tag(name), simple_value=float(number))
            for name, number in scalars.items()
        ]
        self._write(self._summary(value=values), step)
        self._wrote_scalars = True
        for name, value in scalars.items():
            if name.startswith(("val/", "test/")):
                self._final[tags[name]] = float(value)

    def write_image(self, name: str, image: Any, step: int) -> None:
        """``image``: CHW float in [0, 1] (clamped, see FACTS) or uint8."""
        from tensorboardX.summary import image as image_summary

        self._write(image_summary(name, image_uint8(image).numpy()), step)

    def write_histogram(self, name: str, values: Any, step: int) -> None:
        """``values`` of any shape, in numpy's ``auto`` bins."""
        from tensorboardX.summary import histogram

        array = torch.as_tensor(values).detach().cpu().double().numpy()
        self._write(histogram(name, array, bins="auto"), step)

    def write_config(self, config: Mapping[str, Any]) -> None:
        """The config as text, and its values as the run's hyper-parameters: the HParams tab
        shows them, with the final metrics, once the writer finishes."""
        from tensorboardX.summary import text

        config_text = "```json\n" + json.dumps(config, indent=2, default=str) + "\n```"
        self._write(text("config", config_text), 0)
        self._hparams = hparam_values(config)

    def finish(self, status: str) -> None:
        """Write the HParams session (the config's values, the last value of each ``val/``
        and ``test/`` metric written, how the run ended), then close. A pass that wrote no
        scalar writes none: its event file keeps saying that nothing was trained (a work dir
        whose run never completed an iteration is started over)."""
        if self._hparams and self._wrote_scalars and not self._file.closed:
            from tensorboardX.summary import hparams

            for summary in _with_status(hparams(self._hparams, self._final), status):
                self._write(summary, 0)
        self.close()

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self.flush()
        self._file.close()

    def _write(self, summary: Any, step: int) -> None:
        self._write_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def _write_event(self, event: Any) -> None:
        """One TFRecord: length, its masked CRC-32C, the event, the event's masked CRC-32C."""
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        header_crc = struct.pack("<I", _masked(self._crc32c(header)))
        data_crc = struct.pack("<I", _masked(self._crc32c(data)))
        self._file.write(header + header_crc + data + data_crc)
        self._file.flush()

    def _tag(self, name: str) -> str:
        """The tag tensorboardX's ``add_scalar`` writes for ``name``, worked out once."""
        from tensorboardX.summary import scalar

        tag = self._tags[name] = scalar(name, 0.0).value[0].tag
        return tag


def hparam_values(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's values as hyper-parameters: nested keys joined by ``.``, numbers,
    strings and booleans as they are, anything else (lists) as JSON; ``None`` left out."""
    values: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            values.update(hparam_values(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            values[name] = value
        elif value is not None:
            values[name] = json.dumps(value, default=str)
    return values


def _with_status(summaries: tuple[Any, Any, Any], status: str) -> tuple[Any, Any, Any]:
    """tensorboardX's HParams summaries with the session's end status set from the run's
    (it always writes success). TensorBoard's statuses have no "stopped": a run a stop
    signal ended, to be resumed, is neither a success nor a failure, so it is unknown."""
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    end = summaries[2].value[0].metadata.plugin_data
    data = HParamsPluginData.FromString(end.content)
    code = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "killed": "STATUS_UNKNOWN"}
    data.session_end_info.status = Status.Value(code[status])
    end.content = data.SerializeToString()
    return summaries


def _masked(crc: int) -> int:
    """The TFRecord format's checksum from a CRC-32C: rotated right by 15 bits, plus a
    constant."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

"""Where scalars, images and the run's config go: the ``Writer`` interface and built-ins.

More writers come from the ``hookrun.writers`` entry-point group; built-ins are declared
there too, so third-party writers are found exactly the same way.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import socket
import struct
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from hookrun.engine.workdir import CHECKPOINTS
from hookrun.engine.workdir_files import check_no_links
from hookrun.engine.workdir_hold import open_for_writing
from hookrun.errors import ConfigError
from hookrun.hooks.discovery import (
    WRITER_GROUP,
    clash_message,
    clashes,
    clone_folders,
    did_you_mean,
    install_from_clone,
    installed,
)

#: How a run ended, handed to :meth:`Writer.finish`: trackers close their run with it.
RUN_STATUSES = ("finished", "failed", "killed")


class Writer:
    """Base class of writers; constructed as ``Writer(work_dir, **options)`` on rank 0."""

    name: str = ""
    """The writer's entry-point name: its state is saved under ``checkpoint["writers"][name]``."""

    def __init__(self, work_dir: str | Path, **options: Any) -> None:
        self.work_dir = Path(work_dir)
        """The run's folder: a writer keeps its files under it."""
        self.run_checkpoint_dir = self.work_dir / CHECKPOINTS
        """The run's checkpoint folder (what trackers upload from): ``runner.checkpoint_dir``
        once a Runner opens the writer."""

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """Problems of the option values, ``"<option>: <what is wrong>"`` each, found before
        the run starts (unknown option names are found from the constructor's signature)."""
        return []

    def write_scalar(self, name: str, value: float, step: int) -> None:
        """One value; the same as ``write_scalars({name: value}, step)``."""
        self.write_scalars({name: value}, step)

    def write_scalars(self, scalars: Mapping[str, float], step: int) -> None:
        """Write host floats at ``step``: the one method every writer must implement."""
        raise NotImplementedError

    def write_image(self, name: str, image: Any, step: int) -> None:
        """Default: ignore images (a text log has nowhere to put them)."""

    def write_histogram(self, name: str, values: Any, step: int) -> None:
        """The distribution of ``values`` (a tensor or array of any shape: weights,
        gradients) at ``step``, for a plugin that logs them. TensorBoard and W&B draw it;
        the default ignores it (the JSONL log, MLflow, DVCLive and Neptune have no
        histogram of their own)."""

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Default: ignore the config."""

    def write_record(self, record: Mapping[str, Any]) -> None:
        """A structured record (a table, a summary); default: ignore it."""

    def flush(self) -> None:
        """Default: nothing buffered."""

    def close(self) -> None:
        """Release files and connections; the default flushes."""
        self.flush()

    def finish(self, status: str) -> None:
        """Close at the end of a run that ``status`` describes (one of ``RUN_STATUSES``):
        trackers mark their run with it; the default just closes."""
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs (a tracker's run id); saved in checkpoints when not empty."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Given the saved state on resume, and when the same Runner opens its writers again
        (a test pass after training), before anything is written; default: ignore it."""


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


_OPENED = itertools.count()
#: ``json.dumps(record, default=str)`` without building an encoder for every line
_JSON = json.JSONEncoder(default=str)


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
    (it always writes success)."""
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    end = summaries[2].value[0].metadata.plugin_data
    data = HParamsPluginData.FromString(end.content)
    code = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE", "killed": "STATUS_ABORTED"}
    data.session_end_info.status = Status.Value(code[status])
    end.content = data.SerializeToString()
    return summaries


BUILTIN_WRITERS: dict[str, type[Writer]] = {"jsonl": JsonlWriter, "tensorboard": TensorBoardWriter}


def resolve_writers(spec: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Writer classes (or ready instances) with their options; ConfigError with every
    problem of the spec (see ``writer_errors``)."""
    resolved, errors = _resolve(spec)
    if errors:
        raise ConfigError(errors)
    return resolved


def writer_errors(spec: Any) -> list[str]:
    """Every problem of a writers spec, one ``runner.writers...`` line each: its shape,
    unknown names, options a writer's constructor does not take. The Runner and ``config
    validate`` both check through here.

    ``spec``: None, a list of names (or ``Writer`` instances), or a mapping of name to an
    options mapping, null or true (defaults) or false (off).
    """
    return _resolve(spec)[1]


def _resolve(spec: Any) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
    where = "runner.writers"
    entries, errors = _entries(spec, where)
    resolved: list[tuple[Any, dict[str, Any]]] = []
    available = None
    for name, options in entries:
        if isinstance(name, Writer):
            resolved.append((name, {}))
            continue
        cls = BUILTIN_WRITERS.get(name)
        if cls is None:
            available = available or installed(WRITER_GROUP)
            if name not in available:
                own = clone_folders("writers")
                if name in own:
                    errors.append(
                        f"{where}.{name}: writer {name!r} is not installed; "
                        + install_from_clone("writers", name)
                    )
                else:
                    known = {*BUILTIN_WRITERS, *available, *own}
                    errors.append(f"{where}.{name}: unknown writer{did_you_mean(name, known)}")
                continue
            clashing = clashes(WRITER_GROUP).get(name)
            if clashing:
                errors.append(f"{where}.{name}: {clash_message('writer', name, clashing)}")
                continue
            cls = available[name].entry_point.load()
        errors += option_errors(f"{where}.{name}", cls, options)
        resolved.append((cls, options))
    return resolved, errors


def _entries(spec: Any, where: str) -> tuple[list[tuple[Any, dict[str, Any]]], list[str]]:
    """``(name or instance, options)`` pairs of the enabled writers, and shape errors."""
    entries: list[tuple[Any, dict[str, Any]]] = []
    errors: list[str] = []
    if spec is None:
        return entries, errors
    if isinstance(spec, Mapping):
        for name, options in spec.items():
            if not isinstance(name, str):
                errors.append(f"{where}: writer names are strings (got {name!r})")
            elif options is False:
                continue
            elif options is None or options is True:
                entries.append((name, {}))
            elif isinstance(options, Mapping):
                entries.append((name, dict(options)))
            else:
                errors.append(
                    f"{where}.{name}: expected a mapping of options, true or false "
                    f"(got {options!r})"
                )
        return entries, errors
    if isinstance(spec, (list, tuple)):
        for index, name in enumerate(spec):
            if isinstance(name, (str, Writer)):
                entries.append((name, {}))
            else:
                errors.append(f"{where}.{index}: expected a writer name (got {name!r})")
        return entries, errors
    return [], [
        f"{where}: expected a list of writer names or a mapping of name to options (got {spec!r})"
    ]


def option_errors(where: str, cls: type, options: Mapping[str, Any]) -> list[str]:
    """Options the writer's constructor does not take, found before the run starts; ``where``
    is the dotted path of the writer's options in the config."""
    parameters = list(inspect.signature(cls).parameters.values())[1:]  # after work_dir
    values = cls.check_options(options) if issubclass(cls, Writer) else []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return [f"{where}.{line}" for line in values]
    accepted = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [
        f"{where}.{option}: unknown option{did_you_mean(option, accepted)} "
        f"(options: {', '.join(accepted) or 'none'})"
        for option in options
        if option not in accepted
    ]
    return unknown or [f"{where}.{line}" for line in values]


def open_writers(
    resolved: list[tuple[Any, dict[str, Any]]],
    work_dir: Path,
    states: Mapping[str, Mapping[str, Any]] | None = None,
    checkpoint_dir: Path | None = None,
) -> list[Writer]:
    """Instantiate resolved writers in ``work_dir`` (ready instances are used as they are),
    giving each the run's ``checkpoint_dir`` and the state its name holds in ``states``
    (what the same Runner's previous pass left, so a test pass continues the training's
    tracker run)."""
    writers: list[Writer] = []
    try:
        for cls, options in resolved:
            writers.append(cls if isinstance(cls, Writer) else cls(work_dir, **options))
    except BaseException:  # a writer refused (a planted link): the others are closed again
        for writer in writers:
            writer.close()
        raise
    if checkpoint_dir is not None:
        for writer in writers:
            writer.run_checkpoint_dir = checkpoint_dir
    restore_writer_states(writers, states or {})
    return writers


def writer_states(writers: list[Writer]) -> dict[str, dict[str, Any]]:
    """The states worth keeping (named writers with a non-empty ``state_dict``)."""
    states = {w.name: w.state_dict() for w in writers if w.name}
    return {name: state for name, state in states.items() if state}


def restore_writer_states(writers: list[Writer], states: Mapping[str, Any]) -> None:
    """Give each named writer its entry of ``states`` (a checkpoint's ``"writers"``)."""
    for writer in writers:
        state = states.get(writer.name) if writer.name else None
        if isinstance(state, Mapping):
            writer.load_state_dict(state)


def close_writers(writers: list[Writer], status: str) -> dict[str, dict[str, Any]]:
    """Finish every writer with the run's ``status``; returns their states, taken after
    (what finishing uploaded included), for a later pass of the same Runner. Every writer
    is finished even when one of them raises."""
    errors = []
    for writer in writers:
        try:
            writer.finish(status)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return writer_states(writers)


def run_status(exc: BaseException | None, stopped_by_signal: bool) -> str:
    """``killed`` for a stop signal (or Ctrl-C reaching the top), ``failed`` for an
    exception, else ``finished``."""
    if isinstance(exc, KeyboardInterrupt) or (exc is None and stopped_by_signal):
        return "killed"
    return "finished" if exc is None else "failed"


def image_uint8(image: Any) -> torch.Tensor:
    """A writer's image as uint8 on the CPU, its shape kept: floats are taken as [0, 1],
    clamped (tensorboardX wraps values above 1, see FACTS) and rounded."""
    tensor = torch.as_tensor(image).detach().cpu()
    if tensor.dtype != torch.uint8:
        tensor = (tensor.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return tensor


CHECKPOINT_CHOICES = ("best", "last", "none")
"""What a tracker writer may upload at a run's end (its ``checkpoint`` option)."""


def checkpoint_files(folder: Path, which: str, done: Collection[str] = ()) -> list[Path]:
    """The checkpoint files a tracker uploads (``log_checkpoints``): ``best`` every
    ``best_*.pt`` of ``folder``, ``last`` the file its ``latest`` pointer names (a plain
    name of the folder only), ``none`` nothing; less those whose
    :func:`checkpoint_signature` is in ``done`` (uploaded by an earlier pass)."""
    from hookrun.checkpoint.files import pointed

    if which == "best":
        files = sorted(p for p in folder.glob("best_*.pt") if p.is_file())
    else:
        name = pointed(folder) if which == "last" else None
        files = [folder / name] if name and (folder / name).is_file() else []
    return [path for path in files if checkpoint_signature(path) not in done]


def checkpoint_signature(path: Path) -> str:
    """``name size mtime_ns``: tells a file a tracker already uploaded from a rewritten one."""
    stat = path.stat()
    return f"{path.name} {stat.st_size} {stat.st_mtime_ns}"


def _masked(crc: int) -> int:
    """The TFRecord format's checksum from a CRC-32C: rotated right by 15 bits, plus a
    constant."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

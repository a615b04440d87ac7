"""Reading a config: the file's YAML, refused while it is read when it nests too deep, when
its aliases stand for too many values or when a key is given twice, and ``--set KEY=VALUE``
overrides applied to it. Every reason is one line naming the file and line, or the override.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hookrun.errors import ConfigError


def read_yaml(path: Path) -> dict[str, Any]:
    """The config file as a mapping; any reason it cannot be read is one line naming it."""
    try:
        if not path.exists():
            raise ConfigError(f"{path}: config file not found")
        if not path.is_file():  # a folder, a FIFO (reading it would wait forever), a device
            raise ConfigError(f"{path}: not a regular file; name the config file")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8"
        ) from None
    try:
        data = load_yaml(text)
    except yaml.reader.ReaderError as exc:  # a control character
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(
            f"{path}:{line}: invalid YAML: control character #x{exc.character:04x} is not allowed"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "" if isinstance(exc, _Refused) else "invalid YAML: "
        raise ConfigError(f"{where}: {kind}{problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys (task, runner, plugins, ...)")
    return data


MAX_DEPTH = 100
"""The deepest nesting of mappings and lists a config file (or a ``--set`` value) may hold;
deeper is refused while the file is read (Python's own limit would end in a traceback)."""

MAX_ALIAS_VALUES = 100_000
"""How many values (scalars, lists, mappings) the aliases of one file may stand for in all,
each alias counted as a copy of what it names: a "billion laughs" file of a few hundred bytes
is refused while it is read, in bounded time and memory."""


class _Refused(yaml.MarkedYAMLError):
    """YAML that parses but that hookrun refuses to read (too deep, aliases beyond the bound,
    a key given twice); ``problem`` is the whole message."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing while it composes the document, before any value is
    built: nesting deeper than :data:`MAX_DEPTH`, aliases standing for more than
    :data:`MAX_ALIAS_VALUES` values, an alias inside the value it names, and a key given
    twice in one mapping (PyYAML keeps the last silently)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliased = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values it stands for, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                problem = f"alias *{anchor} is used inside the value it names"
                raise _Refused(None, None, problem, mark)
            self._aliased += size
            if self._aliased > MAX_ALIAS_VALUES:
                raise _Refused(
                    None,
                    None,
                    f"aliases stand for more than {MAX_ALIAS_VALUES:,} values (at *{anchor}); "
                    "write the values out or use fewer aliases",
                    mark,
                )
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        children = node.value if isinstance(node, yaml.SequenceNode) else []
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
            _check_keys(node)
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in children)
        return node


# YAML 1.2 reads ``1e-3`` as a number; PyYAML follows YAML 1.1, whose floats need a dot
# (``1.0e-3``) and which reads ``1e-3`` as text. Config files are read the 1.2 way.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _check_keys(node: yaml.MappingNode) -> None:
    """A key given twice in one mapping; keys merged in with ``<<`` may repeat (they are
    overridden by design)."""
    seen: dict[tuple[str, str], Any] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        first = seen.get((key.tag, key.value))
        if first is None:
            seen[(key.tag, key.value)] = key.start_mark
        else:
            raise _Refused(
                None,
                None,
                f"duplicate key {key.value!r} (first at line {first.line + 1}); give each key once",
                key.start_mark,
            )


def load_yaml(text: str) -> Any:
    """``text`` as YAML through :class:`_BoundedLoader` (safe tags only)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """Apply ``a.b=value`` overrides in place (values parsed as YAML); returns errors."""
    errors = []
    for item in overrides:
        key, sep, text = item.partition("=")
        keys = key.strip().split(".")
        if not sep or not all(keys):
            errors.append(f"--set {item}: expected KEY=VALUE with a dotted KEY (a.b=1)")
            continue
        try:
            value = load_yaml(text)
        except _Refused as exc:
            errors.append(f"--set {key.strip()}: {exc.problem}")
            continue
        except yaml.YAMLError:
            errors.append(f"--set {item}: value is not valid YAML")
            continue
        node = data
        for depth, part in enumerate(keys[:-1]):
            child = node.get(part)
            if child is None or isinstance(child, bool):  # `ema: true` -> `ema: {decay: ...}`
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(f"--set {item}: {'.'.join(keys[: depth + 1])} is not a mapping")
                break
            node = child
        else:
            node[keys[-1]] = value
    return errors

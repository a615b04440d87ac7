"""``hookrun plugins new``: write a ready-to-install plugin package."""

from __future__ import annotations

import re
from pathlib import Path

from hookrun.errors import ConfigError
from hookrun.hooks.discovery import distribution_name, installed_plugins

PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "A hookrun plugin: {name}."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["hookrun>=0.1,<0.2"]

[project.entry-points."hookrun.plugins"]
{name} = "{package}:{cls}"

[tool.setuptools]
packages = ["{package}"]
"""

MODULE = '''\
"""{cls}: a hookrun plugin."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hookrun import Plugin, PluginSettings, Priority, hookimpl


class {cls}Settings(PluginSettings):
    interval: int = Field(10, ge=1, description="Report every this many iterations.")


class {cls}(Plugin):
    """Counts training iterations and reports the count every ``interval`` iterations."""

    name = "{name}"
    Settings = {cls}Settings
    priority = Priority.NORMAL
    enabled_by_default = False

    def __init__(self, settings: {cls}Settings | None = None) -> None:
        super().__init__(settings)
        self.iterations = 0

    @hookimpl
    def after_train_iter(self, runner: Any) -> None:
        self.iterations += 1
        if runner.every_n_iters(self.settings.interval):
            runner.info(f"{name}: {{self.iterations}} iterations")

    def state_dict(self) -> dict[str, Any]:
        return {{"iterations": self.iterations}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iterations = state["iterations"]
'''

TEST = '''\
"""The plugin keeps hookrun's plugin contract and counts iterations (fixtures and checks
from hookrun.testing, the pytest plugin that comes with hookrun)."""

from pathlib import Path

import pytest

from hookrun.testing import check_plugin_conformance

# only the plugins a test names load, whatever else is installed
pytestmark = pytest.mark.usefixtures("hookrun_isolated")

README = Path(__file__).resolve().parent.parent / "README.md"


def test_{name}_keeps_the_plugin_contract(tmp_path):
    """Documented settings, default settings, state through a real checkpoint, a run alone,
    no imports of hookrun internals."""
    check_plugin_conformance("{name}", tmp_path, docs_page=README)


def test_{name}_counts_iterations(make_toy_runner):
    runner = make_toy_runner(plugins={{"{name}": {{"interval": 2}}}})  # 2 epochs x 3 batches
    runner.train()
    assert runner.plugins["{name}"].iterations == 6
'''

README = """\
# {dist}

A hookrun plugin. Install it next to hookrun and enable it in a config file:

```bash
pip install -e .
hookrun plugins list
```

```yaml
plugins:
  {name}: {{interval: 10}}
```

Settings:

- `interval` (int, default 10): report every this many iterations.

Run its tests with `pytest tests`.
"""


def new_plugin(name: str, directory: str | Path = ".") -> Path:
    """Write the package ``hookrun-<name>`` into ``directory`` and return its folder."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ConfigError(
            f"plugin name {name!r}: use lowercase letters, digits and underscores, "
            "starting with a letter (it is the entry-point and config key)"
        )
    taken = installed_plugins().get(name)
    if taken is not None:  # the new package would replace it, silently, once installed
        raise ConfigError(
            f"plugin name {name!r} is taken by the installed distribution "
            f"'{taken.distribution} {taken.version}' ({taken.value}); choose another name"
        )
    dist = distribution_name(name)
    package = "hookrun_" + name
    cls = "".join(part.capitalize() for part in name.split("_"))
    root = Path(directory) / dist
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root}: already exists and is not empty; choose another --dir")
    values = {"name": name, "dist": dist, "package": package, "cls": cls}
    files = {
        "pyproject.toml": PYPROJECT,
        f"{package}/__init__.py": MODULE,
        f"tests/test_{name}.py": TEST,
        "README.md": README,
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**values), encoding="utf-8")
    return root

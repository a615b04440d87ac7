"""The documentation: every hook point and setting documented, generated parts complete,
and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hookrun
from hookrun.config.file import Config, RunnerConfig
from hookrun.hooks import specs as hookspecs
from hookrun.hooks.discovery import installed_plugins
from hookrun.hooks.dispatch import hook_arguments, hook_points
from hookrun.testing import layered_venv

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILT_IN = sorted(
    p.name.removeprefix("hookrun-").replace("-", "_") for p in (ROOT / "plugins").glob("hookrun-*")
)


def load_api():
    """hookrun as the API reference reads it: griffe, statically, from the source."""
    import griffe

    return griffe.load("hookrun", search_paths=[str(ROOT / "core")], allow_inspection=False)


def target(obj):
    return obj.final_target if obj.is_alias else obj


def undocumented_members(cls, *also_documented):
    """Public members declared in ``cls`` without a docstring; a member named in the class
    docstring's Attributes section, or documented by a class in ``also_documented`` (the
    Protocol ``Runner`` implements), counts as documented."""
    listed = set()
    for section in cls.docstring.parse("google") if cls.docstring else ():
        if section.kind.value == "attributes":
            listed |= {attribute.name for attribute in section.value}
    missing = []
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias or member.docstring or name in listed:
            continue
        if any(name in o.members and o.members[name].docstring for o in also_documented):
            continue
        missing.append(f"{cls.name}.{name}")
    return missing


def test_every_public_name_has_a_docstring():
    api = load_api()
    protocol = target(api["RunnerProtocol"])
    missing = []
    for name in hookrun.__all__:
        if name == "__version__":
            continue
        obj = target(api[name])
        if not obj.docstring:
            missing.append(name)
        if obj.is_class:
            missing += undocumented_members(obj, protocol)
    testing = api["testing"]  # a package: its public names are re-exports, listed in __all__
    for name in testing.exports:
        member = target(testing[name])
        if member.kind.value in ("function", "class") and not member.docstring:
            missing.append(f"testing.{name}")
    assert not missing, f"public names without a docstring: {missing}"


def test_api_reference_covers_every_exported_name():
    pages = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    shown = set(re.findall(r"^::: hookrun\.(\w+)", pages, flags=re.M))
    assert "testing" in shown
    assert not set(hookrun.__all__) - shown - {"__version__"}


def docs_generator():
    spec = importlib.util.spec_from_file_location("hookrun_docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_hook_point_is_documented_with_arguments_and_example():
    for name in hook_points():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert doc.strip(), f"hook point {name} has no docstring"
        assert "Arguments:" in doc and "Example::" in doc, name
        for argument in hook_arguments(name):
            assert f"``{argument}``" in doc, f"{name}: argument {argument} is not described"


@pytest.mark.parametrize("name", sorted(installed_plugins()))
def test_every_setting_of_every_installed_plugin_has_a_description(name):
    cls = installed_plugins()[name].entry_point.load()
    missing = [f for f, info in cls.Settings.model_fields.items() if not info.description]
    assert not missing, f"plugins.{name}: settings without a description: {missing}"


def test_every_config_key_has_a_description():
    for model in (Config, RunnerConfig):
        missing = [f for f, info in model.model_fields.items() if not info.description]
        assert not missing, f"{model.__name__}: {missing}"


def test_hook_reference_is_generated_for_every_hook_point():
    page = (DOCS / "hooks.md").read_text()  # as committed: readable without building the site
    for name in hook_points():
        args = ", ".join(["self", *hook_arguments(name)])
        assert f"## `{name}`" in page and f"def {name}({args}): ..." in page
    assert not re.search(r"(?<!`)``\w", page)  # reST literals converted to Markdown


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_built_in_plugin_page_gets_its_settings_table(name):
    page = DOCS / "plugins" / f"{name}.md"
    assert page.is_file(), f"{page} is missing"
    text = page.read_text()
    # expanded at build time, or (readable unbuilt) generated into the page
    markers = (f"<!-- settings-table: {name} -->", f"<!-- generated: settings {name} -->")
    assert any(marker in text for marker in markers), f"{page} has no settings table"
    if name not in installed_plugins():
        pytest.skip(f"{name} is not installed here")
    rendered = docs_generator().on_page_markdown(text)
    assert "settings-table" not in rendered
    settings = installed_plugins()[name].entry_point.load().Settings
    for field in settings.model_fields:
        assert f"| `{field}` |" in rendered


def cli_commands(group=None, prefix=()):
    """Every leaf command of the CLI as its words: ("plugins", "list"), ..."""
    import click

    from hookrun.cli.commands import cli

    group = group or cli
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if isinstance(command, click.Group):
            yield from cli_commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


@pytest.mark.parametrize("words", [(), *cli_commands()], ids=" ".join)
def test_every_command_has_a_page_of_its_help(words):
    from click.testing import CliRunner

    from hookrun.cli.commands import cli

    page = DOCS / "commands" / (f"{'-'.join(words)}.md" if words else "index.md")
    assert page.is_file(), f"hookrun {' '.join(words)} has no page {page}"
    args = [*words, "--help"]
    expected = CliRunner().invoke(cli, args, prog_name="hookrun", terminal_width=100).output
    assert f"```text\n{expected}```" in page.read_text()  # as committed
    if "Commands:" in expected:  # a group lists whole summaries, never click's "..." cut
        assert "..." not in expected[expected.index("Commands:") :].split("\n\n")[0]


@pytest.mark.site
def test_site_builds_strict(tmp_path):
    """Run by ``nox -s docs``, which names its ``site/`` folder in ``HOOKRUN_SITE_DIR``: the
    build takes half a minute, which ``nox -s tests`` (against its time limit) leaves out."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    site = Path(os.environ.get("HOOKRUN_SITE_DIR", tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    protocol = (site / "api" / "protocol" / "index.html").read_text()
    for name in target(load_api()["RunnerProtocol"]).members:
        if not name.startswith("_"):
            assert f'id="hookrun.RunnerProtocol.{name}"' in protocol, name
    assert "The first optimizer: the only one" in protocol  # runner.optimizer, its docstring
    for page in (site / "api").glob("*/index.html"):
        assert not re.search(r":\w+:<code>", page.read_text()), f"a reST role left in {page}"
    ema = (site / "plugins" / "ema" / "index.html").read_text()
    assert "<table>" in ema and "decay" in ema


# -- runnable blocks ---------------------------------------------------------------------
# A fenced block right after `<!-- run -->` is executed by the tests below, the blocks of a
# page in order in one temporary folder: `python` blocks in one namespace per page, in this
# process; `bash` blocks whose every command is `hookrun ...` through the CLI's `main` in
# this process (as `hookrun.testing.run_cli` does: no interpreter start), any other `bash`
# block by bash (`set -eu`). `<!-- file: NAME -->` writes the block to NAME in that folder (a
# config a later command reads). Options after `run:`: `exit=2` expects that exit code;
# `slow` marks a command that needs a fresh environment, the network or minutes (`pip
# install`, `python -m build`, `nox -s demo`, torchrun): `nox -s tests` runs every block of a
# page but the slow ones and what they printed (test_runnable_blocks; a block that needs a
# slow one's result is marked slow too), `nox -s docs` runs the pages holding slow blocks
# whole (test_tutorial_page, marked `tutorial`): in a copy of the repository, every bash
# block by bash, with a new virtual environment first on PATH, as a reader with a clone runs
# them. That environment sees the docs session's packages (hookrun among them, with its own
# `hookrun` command), except on a page holding `<!-- venv: empty -->`, whose commands install
# everything themselves.
# `ci` marks a command CI runs itself (the suite): the test checks that `.ci/run` holds it;
# `serves` a command that serves until stopped (a TensorBoard): it must print its address.
# `<!-- output -->` before a plain block: every line of it is a line the run block before it
# printed (spaces aside), so what a page says a command prints is what it prints.
BLOCK = re.compile(
    r"<!--\s*(run|file|output)(?::\s*([^>]*?))?\s*-->\s*\n```(\w*)[^\n]*\n(.*?)\n```", re.S
)
RUNNABLE_PAGES = sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / "README.md", *DOCS.rglob("*.md"))
    if BLOCK.search(p.read_text())
)


def marked_blocks(text: str) -> list[tuple[str, str, str, str]]:
    """(kind, options, language, code) of every marked block of a page, in order."""
    return [m.groups(default="") for m in BLOCK.finditer(text)]


def is_slow(kind: str, options: str) -> bool:
    return kind == "run" and "slow" in options.split()


SLOW_PAGES = [
    page
    for page in RUNNABLE_PAGES
    if any(is_slow(*block[:2]) for block in marked_blocks((ROOT / page).read_text()))
]


def hookrun_commands(code: str) -> list[tuple[list[str], str | None]] | None:
    """The block's commands as (arguments, file stdout goes to) when each is a plain
    ``hookrun ...``, optionally ending in ``> FILE``."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        target = None
        if len(words) > 2 and words[-2] == ">":
            words, target = words[:-2], words[-1]
        if words and (words[0] != "hookrun" or set("|&;<>$`") & set("".join(words))):
            return None
        if words:
            commands.append((words[1:], target))
    return commands


def run_in_bash(code: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Exit code and the output's end of ``bash -euc CODE``."""
    result = subprocess.run(
        ["bash", "-euc", code], cwd=cwd, env=env, capture_output=True, timeout=timeout
    )
    return result.returncode, (result.stdout + result.stderr).decode()


def run_bash_block(code: str, cwd: Path, capsys) -> tuple[int, str]:
    """Exit code and output of a bash block (its last command's code)."""
    from hookrun.cli.commands import main

    commands = hookrun_commands(code)
    if commands is None:
        bin_dir = str(Path(sys.executable).parent)
        env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
        return run_in_bash(code, cwd, env, timeout=600)
    exit_code, output = 0, ""
    for args, target in commands:
        try:
            main(args)
        except SystemExit as exited:
            code_ = exited.code
            exit_code = code_ if isinstance(code_, int) else int(code_ is not None)
        out, err = capsys.readouterr()
        if target:
            (cwd / target).write_text(out)
        output += ("" if target else out) + err
        if exit_code != 0:
            break
    return exit_code, output


def forget_modules_from(folder: Path, loaded: set[str]) -> None:
    """Drop the modules a page imported from its folder (``task``...), so the next page's
    module of the same name is its own."""
    for name in set(sys.modules) - loaded:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


def expected_exit(options: str) -> int:
    found = re.search(r"exit=(\d+)", options)
    return int(found.group(1)) if found else 0


@pytest.fixture
def page_folder(tmp_path, monkeypatch, request) -> Path:
    """The page's working folder as the current one; what its python blocks import from it
    and put on sys.path is forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a block's sys.path.insert is undone
    loaded = set(sys.modules)
    request.addfinalizer(lambda: forget_modules_from(tmp_path, loaded))
    return tmp_path


def run_page(page: str, folder: Path, bash, slow_too: bool) -> None:
    """The page's marked blocks in order, in ``folder`` (the current one): files written there,
    python run here in one namespace, each output block checked against what the bash block
    before it printed; ``bash(code, options, where)`` runs a bash block and returns its exit
    code and output. Without ``slow_too``, slow blocks and what they printed are left out."""
    namespace: dict = {"__name__": "__docs__"}
    previous, output = ("", ""), ""
    for number, (kind, options, language, code) in enumerate(
        marked_blocks((ROOT / page).read_text()), 1
    ):
        where = f"{page}, block {number}"
        left_out = is_slow(kind, options) or (kind == "output" and is_slow(*previous))
        previous = (kind, options) if kind != "output" else previous
        if left_out and not slow_too:
            continue
        if kind == "file":
            target = folder / options
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code + "\n")
        elif kind == "output":
            assert_shown_output(code, output, where)
        elif "ci" in options.split():
            ci = (ROOT / ".ci" / "run").read_text().splitlines()
            assert all(line in ci for line in code.splitlines()), f"{where}: not in .ci/run"
        elif language == "python":
            exec(compile(code, where, "exec"), namespace)
        elif language == "bash":
            exit_code, output = bash(code, options, where)
            assert exit_code == expected_exit(options), f"{where}: exit {exit_code}\n{tail(output)}"
        else:
            pytest.fail(f"{where}: cannot run a {language!r} block")


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_runnable_blocks(page, page_folder, capsys):
    """The page's blocks but the slow ones, `examples/` linked into the folder."""
    (page_folder / "examples").symlink_to(ROOT / "examples")
    run_page(page, page_folder, lambda code, *_: run_bash_block(code, page_folder, capsys), False)


def tail(output: str) -> str:
    """The end of a command's output, for a failure message."""
    return output[-4000:]


def assert_shown_output(shown: str, output: str, where: str) -> None:
    """Every line of an `<!-- output -->` block is a line (spaces aside) of what the run
    block before it printed."""
    printed = {" ".join(line.split()) for line in output.splitlines()}
    for line in filter(str.strip, shown.splitlines()):
        assert " ".join(line.split()) in printed, f"{where}: not printed: {line!r}\n{tail(output)}"


def copy_of_the_repository(target: Path) -> Path:
    """The clone's tracked and unignored files (what a reader's clone holds) under target."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def reader_env(venv: Path, sees_this_environment: bool) -> dict[str, str]:
    """A new virtual environment, first on PATH: empty, or seeing this one's packages."""
    if sees_this_environment:
        python = layered_venv(venv, with_pip=True)
        script = venv / "bin" / "hookrun"  # what the layered packages' scripts lack
        script.write_text(f"#!{python}\nfrom hookrun.cli.commands import main\n\nmain()\n")
        script.chmod(0o755)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    skipped = ("PYTHON", "NOX", "VIRTUAL", "HOOKRUN")  # the test session's own settings
    env = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        VIRTUAL_ENV=str(venv),
        PIP_COMPILE="0",  # no byte-compiling of torch at install (a minute); imports write it
    )
    return env


def assert_serves(code: str, cwd: Path, env: dict[str, str], where: str) -> str:
    """A command that serves until stopped (a TensorBoard): it must print its address
    within two minutes; it is stopped then. Returns what it printed."""
    server = subprocess.Popen(
        ["bash", "-euc", code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timer = threading.Timer(120, os.killpg, (server.pid, signal.SIGKILL))
    timer.start()
    printed = b""
    try:
        assert server.stdout is not None
        for line in server.stdout:
            printed += line
            if b"http://" in line:
                return printed.decode()
        pytest.fail(f"{where}: exited {server.wait()} without serving\n{printed.decode()}")
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    return printed.decode()


@pytest.mark.tutorial
@pytest.mark.parametrize("page", SLOW_PAGES)
def test_tutorial_page(page, page_folder):
    """Every marked block of the page, in a copy of the repository, as a reader runs them."""
    repo = copy_of_the_repository(page_folder / "hookrun")
    empty = "<!-- venv: empty -->" in (ROOT / page).read_text()
    env = reader_env(page_folder / "venv", not empty)
    os.chdir(repo)

    def bash(code: str, options: str, where: str) -> tuple[int, str]:
        if "serves" in options.split():
            return 0, assert_serves(code, repo, env, where)
        started = time.perf_counter()
        result = run_in_bash(code, repo, env, timeout=1200)
        print(f"{where}: {time.perf_counter() - started:.0f} s")  # the page's durations (-s)
        return result

    run_page(page, repo, bash, True)


def test_marked_blocks_are_found():
    text = "<!-- file: a.yaml -->\n```yaml\nx: 1\n```\n<!-- run: exit=2 -->\n```bash\nfalse\n```"
    expected = [("file", "a.yaml", "yaml", "x: 1"), ("run", "exit=2", "bash", "false")]
    assert marked_blocks(text) == expected
    assert hookrun_commands("hookrun a \\\n  b  # c\nhookrun d --json > e.json") == [
        (["a", "b"], None),
        (["d", "--json"], "e.json"),
    ]
    assert hookrun_commands("hookrun a | head") is None
    assert hookrun_commands("python -m build") is None

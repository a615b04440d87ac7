"""Every developer task. Each environment installs with constraints.txt (torch==2.13.0)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
CONSTRAINTS = ["-c", str(ROOT / "constraints.txt")]
# every distribution beside the core: the built-in plugins and the tracker writers
PLUGINS = sorted(
    p
    for p in (*(ROOT / "plugins").glob("hookrun-*"), *(ROOT / "writers").glob("hookrun-*"))
    if (p / "pyproject.toml").exists()
)
TEST_DEPS = [
    "packaging",  # requirement comparison in the writers' missing-library test
    "pytest-xdist",
    "pytest>=8",
    "scikit-learn",
    "tensorboard",
    "numpy",
    "setuptools>=70",
    "pytorch-ignite>=0.5.5",  # the reference for early stopping and top-k checkpoints
    "torchdata",  # StatefulDataLoader: the stateful loader the stream tests resume mid-epoch
    "moto[server]",  # a real S3-compatible server for the checkpoint storage tests
    "s3fs",  # fsspec's S3 file system, which those tests use
]
# the trackers' own libraries, to read their stores back in the writers' tests
TRACKER_DEPS = ["mlflow-skinny", "dvclive", "wandb", "neptune"]
# mkdocstrings renders docs/api/ from the docstrings; griffe (its parser) also backs the docs test
DOCS_DEPS = ["mkdocs-material", "jsonschema", "mkdocstrings[python]>=0.26"]
LIST_WRITERS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted(e.name for e in m.entry_points(group='hookrun.writers'))))"
)


def install_project(session: nox.Session, *extra: str) -> None:
    """hookrun and every built-in plugin, editable, with the pinned torch, in one pip call.

    The local packages build against the environment's setuptools: an isolated build
    environment for each of the 14 cost about a minute of CPU. Nothing is byte-compiled at
    install (pip would compile ~18,000 files on one core, over a minute): the session's
    processes write the bytecode of what they import, once, as they import it — also where
    the machine sets PYTHONDONTWRITEBYTECODE, which an empty value turns off for the session
    (without bytecode every process would compile torch again)."""
    session.env["PYTHONDONTWRITEBYTECODE"] = ""
    session.log("installing setuptools, the build backend of every local package")
    session.install(*CONSTRAINTS, "setuptools>=70")
    editables = ["-e", "."]
    for plugin in PLUGINS:
        editables += ["-e", str(plugin)]
    options = ["--no-build-isolation", "--no-compile"]
    session.log(
        f"installing hookrun and {len(PLUGINS)} plugins and writers (editable), the pinned torch"
        " and the test dependencies: a minute or more, pip prints nothing until it is done"
    )
    session.install(*options, *CONSTRAINTS, *editables, *TEST_DEPS, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite: core, CLI, cross-plugin and every plugin's own tests."""
    install_project(session, *DOCS_DEPS, *TRACKER_DEPS)
    paths = ["tests", *(str(p / "tests") for p in PLUGINS if (p / "tests").exists())]
    pytest = ["pytest", "-q", "-rs", "-p", "no:cacheprovider", *paths, *session.posargs]
    # in parallel, then alone the tests asserting wall-clock durations, which a busy neighbour
    # can break (exit 5: none selected). One worker more than the cores (at most 4): many
    # tests wait on child processes (torchrun ranks, killed and resumed jobs), and a third
    # worker keeps two cores busy meanwhile (5:12 instead of 5:51 here); an idle worker takes
    # queued tests from a busy one
    workers = str(min(4, (os.cpu_count() or 1) + 1))
    parallel = ["-n", workers, "--dist", "worksteal"]
    session.run(*pytest, *parallel, "-m", "not timing and not tutorial and not site")
    session.run(*pytest, "-m", "timing", success_codes=[0, 5])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy on the core package and on every plugin package (against ``RunnerProtocol``)."""
    install_project(session, "mypy", "types-PyYAML", "pydantic>=2.14", *TRACKER_DEPS)
    packages = [str(init.parent) for p in PLUGINS for init in p.glob("hookrun_*/__init__.py")]
    # mypy does not follow setuptools' editable finders: give it the source folders
    search = os.pathsep.join(["core", *(str(p) for p in PLUGINS)])
    session.run("mypy", "core/hookrun", *packages, env={"MYPYPATH": search})


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into ``site/`` with --strict and check its pages
    (``test_site_builds_strict``), and run the tutorial pages' commands that need a fresh
    environment (installs, wheels, nox -s demo, torchrun) as a reader does, in a copy of the
    repository."""
    install_project(session, *DOCS_DEPS)
    selected = ["tests/test_docs.py", "-m", "tutorial or site", "-n", "auto", "--maxprocesses", "4"]
    session.run(
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        *selected,
        *session.posargs,
        env={"HOOKRUN_SITE_DIR": str(ROOT / "site")},
    )


@nox.session
def demo(session: nox.Session) -> None:
    """Train the digits job with all five plugins (the README's first command)."""
    install_project(session)
    work_dir = session.posargs[0] if session.posargs else "runs/digits"
    # --resume auto: a fresh folder starts training, a finished run is only tested again
    session.run(
        "hookrun",
        "train",
        "examples/digits/config.yaml",
        "--work-dir",
        work_dir,
        "--resume",
        "auto",
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark, hookrun against hand-written loops and the peers."""
    # timm is left out: it needs torchvision, which has no build that imports beside torch 2.13 CPU
    install_project(session, "mmengine", "lightning", "pytorch-ignite")
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        session.run("python", str(script), *session.posargs)


@nox.session
def plugins(session: nox.Session) -> None:
    """Each plugin and writer built, installed alone with hookrun in a fresh env, listed and
    tested."""
    session.install("build")
    dist_dir = Path(session.create_tmp()) / "dist"
    session.run("python", "-m", "build", "--outdir", str(dist_dir), ".")
    core_wheel = next(dist_dir.glob("hookrun-*.whl"))
    for plugin in PLUGINS:
        out = dist_dir / plugin.name
        session.run("python", "-m", "build", "--outdir", str(out), str(plugin))
        wheel = next(out.glob("*.whl"))
        venv = Path(session.create_tmp()) / f"venv-{plugin.name}"
        session.run("python", "-m", "venv", "--clear", str(venv), external=True)
        py = str(venv / "bin" / "python")
        session.run(
            py,
            "-m",
            "pip",
            "install",
            "-q",
            *CONSTRAINTS,
            str(core_wheel),
            str(wheel),
            *TEST_DEPS,
            external=True,
        )
        if plugin.parent.name == "writers":  # a writer entry point beside the built-in two
            listed = session.run(py, "-c", LIST_WRITERS, silent=True, external=True)
            names = [n for n in json.loads(str(listed)) if n not in ("jsonl", "tensorboard")]
        else:
            listed = session.run(
                py, "-m", "hookrun", "plugins", "list", "--json", silent=True, external=True
            )
            names = [row["name"] for row in json.loads(str(listed))]
        expected = plugin.name.removeprefix("hookrun-").replace("-", "_")
        if names != [expected]:
            session.error(f"{plugin.name}: plugins list shows {names}, expected [{expected!r}]")
        env = {"HOOKRUN_ISOLATED": "1", "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        session.run(
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(plugin / "tests"),
            env=env,
            external=True,
        )

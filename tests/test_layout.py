"""The shape of the house (DESIGN §1): no import circles between hookrun's modules, and plugins
and writers use only ``hookrun.__all__``. Both read source files with ``ast`` (nothing is
imported), and name no module, so they hold whatever the layout inside ``core/hookrun`` is."""

from __future__ import annotations

import ast
import contextlib
import textwrap
from collections import deque
from pathlib import Path

import pytest

from hookrun.testing import internal_imports, is_test_file

ROOT = Path(__file__).resolve().parent.parent
HOOKRUN = ROOT / "core" / "hookrun"


def module_files(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name; a package's ``__init__.py`` is the package."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` imports, wherever the import stands
    (in a function, under ``if TYPE_CHECKING:``). ``from p import x`` is the module ``p.x``
    when that is one, else ``p``; an import of a name inside a module is that module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, [base, node.module]))
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import p.m.x``: the longest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Which of the package's modules each of its modules imports."""
    modules = module_files(package)
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    # The top package's __init__ imports its exports lazily (``__getattr__`` over a table of
    # module names; its own imports are for type checkers only), so importing it runs none of
    # them: it depends on nothing, and an import of it from a submodule ends there.
    graph[package.name] = set()
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_circle(graph: dict[str, set[str]], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself (breadth first); empty when there is none."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                circle = [node]
                while circle[-1] != start:
                    circle.append(previous[circle[-1]])
                return circle[::-1]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """For every module caught in a circle, a shortest circle through it, each circle once and
    started at its smallest name: together they name every module and show how each is caught."""
    found = set()
    for component in strongly_connected(graph):
        for node in component:
            circle = shortest_circle(graph, node)
            if circle:
                first = circle.index(min(circle))
                found.add(tuple(circle[first:] + circle[:first]))
    return [list(circle) for circle in sorted(found)]


def render(circle: list[str]) -> str:
    return " -> ".join([*circle, circle[0]])


def test_circle_finder_names_each_circle_once():
    graph = {
        "a": {"b"},
        "b": {"c", "x"},
        "c": {"a", "b"},
        "x": {"y"},
        "y": set(),
        "s": {"s"},
        "p": {"q"},
        "q": {"p", "a"},
    }
    assert [render(c) for c in circles(graph)] == [
        "a -> b -> c -> a",
        "b -> c -> b",
        "p -> q -> p",
        "s -> s",
    ]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_import_graph_counts_every_import(tmp_path):
    package = tmp_path / "pkg"
    write(package / "__init__.py", "from pkg.a import A\n")  # the top package: lazy by rule
    write(package / "a.py", "import os\nfrom pkg import b\nfrom pkg.sub import thing\n")
    write(
        package / "b.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
    )
    write(package / "sub" / "__init__.py", "from .c import C\n")
    write(package / "sub" / "c.py", "import pkg\n\ndef f():\n    from .. import b\n")
    write(package / "sub" / "d.py", "import pkg.sub.c\nfrom . import c, d\n")
    assert import_graph(package) == {
        "pkg": set(),
        "pkg.a": {"pkg.b", "pkg.sub"},
        "pkg.b": {"pkg.a"},
        "pkg.sub": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg", "pkg.b"},
        "pkg.sub.d": {"pkg.sub.c"},
    }
    assert [render(c) for c in circles(import_graph(package))] == [
        "pkg.a -> pkg.b -> pkg.a",
        "pkg.a -> pkg.sub -> pkg.sub.c -> pkg.b -> pkg.a",
    ]


def test_hookrun_modules_import_no_circle():
    graph = import_graph(HOOKRUN)
    assert any(graph.values()), "no import between hookrun's modules was found"
    found = circles(graph)
    assert not found, "hookrun's modules import each other in a circle:\n" + "\n".join(
        map(render, found)
    )


def public_api_users() -> list[Path]:
    """The source files of every plugin and writer package in the repository."""
    tops = sorted([*ROOT.glob("plugins/*/hookrun_*"), *ROOT.glob("writers/*/hookrun_*")])
    return [f for top in tops for f in (sorted(top.rglob("*.py")) if top.is_dir() else [top])]


def test_plugins_and_writers_use_only_hookrun_all():
    files = public_api_users()
    assert files, "no plugin or writer package found"
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in internal_imports(
            path.read_text(encoding="utf-8"), test_file=is_test_file(path)
        )
    ]
    assert not problems, "plugins and writers use hookrun names outside hookrun.__all__:\n" + (
        "\n".join(problems)
    )


def imported_names(source: str) -> set[str]:
    """The top-level module names ``source`` imports, in code or in a script it holds as a
    string (a job written out and run as a process)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
        elif isinstance(node, ast.Constant) and "import" in str(node.value):
            with contextlib.suppress(SyntaxError, ValueError, TypeError):  # prose, not a script
                names |= imported_names(textwrap.dedent(node.value))
    return names


def runs_as_script(source: str) -> bool:
    """Whether ``source`` ends in ``if __name__ == "__main__":`` (a job, not a test module)."""
    body = ast.parse(source).body
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in body)


def house_problems(root: Path) -> list[str]:
    """What breaks the tests' house under ``root``: a file that imports a test module, a script
    run as a process beside test modules (its place: ``jobs/``), and a helper module beside the
    core tests (its place: ``tests/_support/``, or ``hookrun.testing``)."""
    folders = [root / "tests", *sorted(root.glob("plugins/*/tests"))]
    folders += sorted(root.glob("writers/*/tests"))
    test_modules = {path.stem for folder in folders for path in folder.rglob("test_*.py")}
    problems = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            where, source = path.relative_to(root), path.read_text(encoding="utf-8")
            for name in sorted(imported_names(source) & test_modules):
                problems.append(f"{where} imports the test module {name}")
            if path.parent == folder and runs_as_script(source):
                problems.append(f"{where} is a script beside the test modules")
            elif path.parent == root / "tests" and not is_test_file(path):
                problems.append(f"{where} is a helper beside the test modules")
    return problems


def test_no_test_module_imports_another_and_jobs_and_helpers_live_apart(tmp_path: Path) -> None:
    script = "if __name__ == '__main__':\n    pass\n"
    write(tmp_path / "tests" / "test_a.py", "from test_b import x\n")
    write(tmp_path / "tests" / "helper.py", "")
    write(tmp_path / "tests" / "jobs" / "job.py", script)
    write(tmp_path / "tests" / "_support" / "__init__.py", "import torch\n")
    write(tmp_path / "plugins" / "p" / "tests" / "test_b.py", "S = '''\nimport test_a\n'''\n")
    write(tmp_path / "plugins" / "p" / "tests" / "p_job.py", script)
    assert house_problems(tmp_path) == [
        "tests/helper.py is a helper beside the test modules",
        "tests/test_a.py imports the test module test_b",
        "plugins/p/tests/p_job.py is a script beside the test modules",
        "plugins/p/tests/test_b.py imports the test module test_a",
    ]
    assert house_problems(ROOT) == []


def plugin_facts() -> tuple[set[str], set[str], set[str]]:
    """The shipped plugins' entry-point names, package names and settings' field names,
    read from their sources (``name = "..."`` and the fields of ``PluginSettings`` classes)."""
    names, packages, fields = set(), set(), set()
    for path in ROOT.glob("plugins/*/hookrun_*/*.py"):
        packages.add(path.parent.name)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            settings = any("PluginSettings" in ast.unparse(base) for base in node.bases)
            for item in node.body:
                if settings and isinstance(item, ast.AnnAssign):
                    fields.add(ast.unparse(item.target))
                named = isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                if named and any(ast.unparse(t) == "name" for t in item.targets):
                    names.add(str(item.value.value))
    return names, packages, fields


def own_names(tree: ast.AST) -> set[str]:
    """The names a module defines as its own: functions, classes, parameters, keywords,
    attributes it assigns and class fields (a local variable is not one)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found.add(node.name)
            found.update(ast.unparse(i.target) for i in node.body if isinstance(i, ast.AnnAssign))
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return found


def plugin_knowledge(
    tree: ast.AST, names: set[str], packages: set[str], settings: set[str]
) -> list[tuple[int, str]]:
    """Where a module reaches into a plugin: imports or names its package, looks a plugin up
    by its name as a key (``plugins["checkpoint"]``, ``.get("checkpoint")``, ``"ema" in``),
    or reads one of ``settings`` (``.settings.out_dir``, ``["out_dir"]``, ``.get("out_dir")``,
    ``getattr(x, "out_dir")``)."""
    found = []

    def key(node: ast.AST | None, among: set[str]) -> str | None:
        constant = isinstance(node, ast.Constant) and isinstance(node.value, str)
        return node.value if constant and node.value in among else None

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(line, a.name) for a in node.names if a.name.split(".")[0] in packages]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in packages:
            found.append((line, str(node.module)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.split(".")[0] in packages:
                found.append((line, repr(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr in settings:
            if isinstance(node.value, ast.Attribute) and node.value.attr == "settings":
                found.append((line, f".settings.{node.attr}"))
        elif isinstance(node, ast.Subscript):
            if found_key := key(node.slice, names | settings):
                found.append((line, f"[{found_key!r}]"))
        elif isinstance(node, ast.Call) and node.args:
            method = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if method in ("get", "pop", "setdefault") and key(node.args[0], names | settings):
                found.append((line, f".{method}({node.args[0].value!r})"))
            getter = isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
            if getter and len(node.args) > 1 and key(node.args[1], settings):
                found.append((line, f"getattr {node.args[1].value!r}"))
        elif isinstance(node, ast.Compare) and (plugin := key(node.left, names)):
            membership = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            found += [(line, f"{plugin!r} in")] if membership else []
    return found


def test_plugin_knowledge_finds_each_way_of_reaching_into_a_plugin():
    source = (
        "import hookrun_ema\n"
        "from hookrun_checkpoint.ledger import survey\n"
        "section = plugins.get('checkpoint')\n"
        "folder = section['out_dir']\n"
        "plugin = runner.plugins['checkpoint']\n"
        "if 'ema' in runner.plugins: folder = plugin.settings.out_dir\n"
        "d = getattr(plugin.settings, 'out_dir', None)\n"
        "ok = checkpoint['model'], runner.plugins.get(name), self.out_dir, ['ema', 'out_dir']\n"
    )
    names, packages = {"checkpoint", "ema"}, {"hookrun_ema", "hookrun_checkpoint"}
    found = plugin_knowledge(ast.parse(source), names, packages, {"out_dir"})
    assert sorted(found) == [
        (1, "hookrun_ema"),
        (2, "hookrun_checkpoint.ledger"),
        (3, ".get('checkpoint')"),
        (4, "['out_dir']"),
        (5, "['checkpoint']"),
        (6, "'ema' in"),
        (6, ".settings.out_dir"),
        (7, "getattr 'out_dir'"),
    ]


CORE_MODULES = sorted(HOOKRUN.rglob("*.py"))


@pytest.mark.parametrize(
    "path",
    [pytest.param(path, id=str(path.relative_to(HOOKRUN))) for path in CORE_MODULES],
)
def test_core_names_no_plugin_its_package_or_settings(path):
    """The core asks plugins through documented methods (``Plugin.checkpoint_dir``): no core
    module names a shipped plugin's package, looks a plugin up by its name, or reads a
    setting only a plugin defines (the checkpoint plugin's ``out_dir``)."""
    names, packages, fields = plugin_facts()
    assert "checkpoint" in names and "hookrun_checkpoint" in packages and "out_dir" in fields
    core = set().union(*(own_names(ast.parse(p.read_text(encoding="utf-8"))) for p in CORE_MODULES))
    plugin_only = fields - core
    assert "out_dir" in plugin_only
    found = plugin_knowledge(
        ast.parse(path.read_text(encoding="utf-8")), names, packages, plugin_only
    )
    assert not found, f"{path.relative_to(ROOT)} reaches into plugins: " + ", ".join(
        f"line {line}: {what}" for line, what in found
    )

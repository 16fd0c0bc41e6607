"""The library's imports run one way: no module imports a module that imports it back, no
llmtrial import hides inside a function, and the packages import only the packages below them.

The imports are read from the source with ``ast`` (module level, inside functions and
classes, under ``if TYPE_CHECKING:`` alike), never by importing the modules, so import order
cannot hide a cycle.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = "llmtrial"
LIBRARY = REPO / "workflow" / PACKAGE
#: The library's packages, bottom first: each may import only those before it. The modules at
#: the top (the trial file, provenance, the command line) may import any package; none imports them.
PACKAGES = ("onnode", "core", "answers", "logs", "host", "plan", "weights", "patch", "lifecycle", "serve", "report", "compare", "export")


@functools.cache
def _parse(source: str, filename: str) -> ast.Module:
    return ast.parse(source, filename=filename)


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per source for every test of this module (callers only read it)."""
    return _parse(path.read_text(encoding="utf-8"), str(path))


def module_name(path: Path, root: Path = LIBRARY) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((PACKAGE, *parts[:-1])) if parts[-1] == "__init__" else ".".join((PACKAGE, *parts))


def library_modules(root: Path = LIBRARY) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (``from . import x`` included)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path, importer: str, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported library module, line, inside a function) for every import in ``path``."""
    tree = parsed(path)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(child, importer, is_package)
                # ``from llmtrial import hub`` imports the submodule; ``from llmtrial.weights.hub import X`` the module
                names = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target
                         for alias in child.names]
            else:
                visit(child, nested)
                continue
            for name in names:
                if name == PACKAGE or name.startswith(PACKAGE + "."):
                    # ``import llmtrial.a.b`` depends on llmtrial.a.b (the deepest library module named)
                    while name not in known and "." in name:
                        name = name.rsplit(".", 1)[0]
                    found.append((name, child.lineno, in_function))

    visit(tree, False)
    return found


def import_graph(root: Path = LIBRARY) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> library modules it imports, "module:line imports X inside a function" lines)."""
    modules = library_modules(root)
    known = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    hidden: list[str] = []
    for name, path in modules.items():
        for target, line, in_function in imports_of(path, name, known):
            if target != name:
                graph[name].add(target)
            if in_function:
                hidden.append(f"{path.relative_to(root.parent.parent)}:{line} imports {target} inside a function")
    return graph, list(dict.fromkeys(hidden))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one
    module (or one that imports itself), as a sorted list (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_the_library_has_no_import_cycle() -> None:
    graph, _ = import_graph()
    assert len(graph) > 10, f"found only {sorted(graph)} under {LIBRARY}"
    found = cycles(graph)
    assert not found, "import cycles among the library's modules: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) + ")" for c in found)


def test_no_llmtrial_import_inside_a_function() -> None:
    _, hidden = import_graph()
    assert not hidden, "llmtrial imports inside functions (import at module level instead):\n" + "\n".join(hidden)


#: Statements that make a string constant a program rather than prose or a template.
_PROGRAM_STATEMENTS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.For, ast.While,
                       ast.If, ast.With, ast.Try)


def programs_in_strings(root: Path = LIBRARY) -> list[str]:
    """``file:line`` of every string constant over more than one line that is Python source with a
    statement in it: a program no linter, type check or structure test would read."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") > 1):
                continue
            try:
                body = ast.parse(node.value)
            except SyntaxError:
                continue
            if any(isinstance(n, _PROGRAM_STATEMENTS) for n in ast.walk(body)):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_program_hides_in_a_string() -> None:
    """What runs on a node is a module of llmtrial.onnode, sent by its file's source."""
    assert programs_in_strings() == []


def test_the_checker_finds_a_program_in_a_string_and_passes_prose(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": 'P = """\nimport os\nprint(os.getpid())\n"""\n',
                               "b.py": '"""Prose over\ntwo lines,\nnot a program."""\nT = """{{ name }}\n<p>\n"""\n'})
    assert programs_in_strings(root) == ["a.py:1"]


def test_one_class_per_name_in_the_library() -> None:
    """A name means one thing: no two modules of the library define a class of the same name (the
    patches' hooks are patch data, not the library)."""
    where: dict[str, list[str]] = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        if "patches" in path.relative_to(LIBRARY).parts:
            continue
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(LIBRARY)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def package_of(module: str) -> str | None:
    """The package a library module sits in (``llmtrial.plan.shape`` -> ``plan``); None at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in PACKAGES) else None


def upward_imports(graph: dict[str, set[str]], order: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every import that runs against ``order``: a package importing one above it, or a top module."""
    rank = {p: i for i, p in enumerate(order)}
    out = []
    for importer, targets in sorted(graph.items()):
        here = package_of(importer)
        if here is None:
            continue
        for target in sorted(targets):
            there = package_of(target)
            if there is None:
                out.append(f"{importer} imports the top module {target}")
            elif there not in rank or here not in rank:
                out.append(f"{importer} imports {target}: a package outside {order}")
            elif rank[there] > rank[here]:
                out.append(f"{importer} ({here}) imports {target} ({there}), a package above it")
    return out


def test_the_packages_import_only_the_packages_below_them() -> None:
    graph, _ = import_graph()
    # patches/ holds patch data (a hook.py among them), not library code
    found = {package_of(m) for m in graph} - {None, "patches"}
    assert found == set(PACKAGES), f"packages on disk {sorted(found)} against the order {PACKAGES}"
    upward = upward_imports(graph)
    assert not upward, "imports that run up the package order:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_names_what_it_offers(package: str) -> None:
    """The package's ``__init__`` describes every module and lists it in ``__all__``, and imports
    nothing (a package is never loaded whole for one module)."""
    init = LIBRARY / package / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree) or ""
    modules = sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__")
    [offered] = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"]]
    assert sorted(offered) == modules
    assert [m for m in modules if f":mod:`llmtrial.{package}.{m}`" not in doc] == []
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_the_tests_mirror_the_packages() -> None:
    """Each package's tests sit in ``tests/<package>/``; no test file sits in a folder named
    after no package."""
    tests = REPO / "tests"
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= {*PACKAGES, "workflow"}, sorted(folders - {*PACKAGES, "workflow"})
    assert [p for p in PACKAGES if not (tests / p).is_dir()] == []


# --------------------------------------------------------------------------- the checker itself


def test_the_checker_finds_an_import_up_the_package_order(tmp_path: Path) -> None:
    root = _package(tmp_path, {"low/__init__.py": "", "low/a.py": "from llmtrial.high.b import x\n",
                               "high/__init__.py": "", "high/b.py": "from llmtrial.low import a\n",
                               "top.py": "from llmtrial.high import b\n"})
    graph, _ = import_graph(root)
    assert upward_imports(graph, ("low", "high")) == ["llmtrial.low.a (low) imports llmtrial.high.b (high), a package above it"]
    (root / "low" / "a.py").write_text("from llmtrial import top\n")
    assert upward_imports(import_graph(root)[0], ("low", "high")) == ["llmtrial.low.a imports the top module llmtrial.top"]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "workflow" / PACKAGE
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("a, b", [
    ("from llmtrial.b import x\n", "from llmtrial.a import y\n"),
    ("from llmtrial import b\n", "import llmtrial.a\n"),
    ("from . import b\n", "from .a import y\n"),
    ("from llmtrial.b import x\n", "def f():\n    from llmtrial.a import y\n"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmtrial.b import X\n", "from llmtrial.a import y\n"),
])
def test_the_checker_finds_a_direct_cycle_however_it_is_written(tmp_path: Path, a: str, b: str) -> None:
    graph, _ = import_graph(_package(tmp_path, {"a.py": a, "b.py": b}))
    assert cycles(graph) == [["llmtrial.a", "llmtrial.b"]]


def test_the_checker_finds_a_transitive_cycle_and_passes_a_chain(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "from llmtrial import b\n", "b.py": "from llmtrial.c import z\n",
                               "c.py": "import json\nfrom llmtrial.a import y\n"})
    assert cycles(import_graph(root)[0]) == [["llmtrial.a", "llmtrial.b", "llmtrial.c"]]
    (root / "c.py").write_text("import json\n")
    assert cycles(import_graph(root)[0]) == []


def test_the_checker_finds_an_import_inside_a_function(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "import json\n\n\nclass A:\n    def f(self):\n        import torch\n"
                                       "        from llmtrial import b\n        return b\n",
                               "b.py": "X = 1\n"})
    graph, hidden = import_graph(root)
    assert graph["llmtrial.a"] == {"llmtrial.b"} and cycles(graph) == []
    assert hidden == ["workflow/llmtrial/a.py:7 imports llmtrial.b inside a function"]


def test_schemas_templates_and_patches_ship_in_the_package(tmp_path):
    """A wheel (a non-editable install) carries the package data the library finds through
    importlib.resources."""
    import subprocess
    import zipfile

    from llmtrial.core.resources import PATCHES, SCHEMAS, TEMPLATES

    assert (SCHEMAS / "config.schema.json").is_file() and (TEMPLATES / "report.html.j2").is_file()
    assert (PATCHES / "demo-worker-log" / "patch.yaml").is_file()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO)], check=True, timeout=300)
    [wheel] = tmp_path.glob("llmtrial-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    schemas = [*SCHEMAS.glob("*.yaml"), *SCHEMAS.glob("*.json")]
    assert len([s for s in schemas if s.name.endswith(".record.schema.json")]) == 10  # one per record kind
    for schema in schemas:
        assert f"llmtrial/schemas/{schema.name}" in names
    assert "llmtrial/templates/report.html.j2" in names and "llmtrial/templates/comparison.html.j2" in names
    assert {"llmtrial/patches/demo-worker-log/patch.yaml", "llmtrial/patches/demo-worker-log/patch.diff",
            "llmtrial/patches/demo-worker-log/hook.py"} <= names


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "benchmarks").glob("*.py")))
def test_each_benchmark_script_imports_only_what_the_library_has(script: str) -> None:
    """The benchmark scripts run outside the suite; a name the library renamed or removed breaks them
    silently, so each ``from llmtrial... import`` of theirs is checked against the library as it is."""
    tree = ast.parse((REPO / "benchmarks" / script).read_text(encoding="utf-8"))
    wanted = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
              and n.module.split(".")[0] == PACKAGE for a in n.names]
    missing = [f"{module}.{name}" for module, name in wanted
               if not hasattr(importlib.import_module(module), name)
               and importlib.util.find_spec(f"{module}.{name}") is None]
    assert not missing, f"benchmarks/{script} imports what the library does not have: {', '.join(missing)}"

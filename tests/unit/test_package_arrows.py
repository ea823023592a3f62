"""The package graph points one way in every room, read from the sources alone.

The layout is pyproject.toml's `[tool.setuptools.package-dir]` (legato is trainer/, legato.orchestrator is
orchestrator/, ...). In every package, each child (a module, or a subpackage with all it holds) is one node, and an
import by any module of one child of any module of another is an arrow between them, whether it sits at the top of a
file or inside a function (an import inside a function still runs). The arrows must form no cycle: the layers of a
package are then the order its children can be imported in, and an import that climbs back up a layer is exactly one
that closes a cycle. Imports under `if TYPE_CHECKING:` are left out: they never run, and name a type only.

Two rules stand above that: the core (everything but legato.orchestrator and legato.slurm) imports neither, and
nothing imports the repository folders by their own names (trainer, slurm, orchestrator).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

OUTER = ("legato.orchestrator", "legato.slurm")  # the core (the rest of legato) must import neither


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the installed package, by its dotted name, from the package-dir table of `root`'s pyproject."""
    section = _section((root / "pyproject.toml").read_text(), "tool.setuptools.package-dir")
    table = dict(re.findall(r'^"([\w.]+)" = "([\w/]+)"$', section, re.M))
    folders = {(root / folder).resolve(): package for package, folder in table.items()}
    unmapped = [p.parent for f in folders for p in f.rglob("__init__.py") if p.parent.resolve() not in folders]
    assert unmapped == [], f"packages missing from pyproject's package-dir (not installed, not checked): {unmapped}"
    modules: dict[str, Path] = {}
    for folder, package in folders.items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _section(toml: str, name: str) -> str:
    """The body of table `[name]` of a TOML text (tomllib is Python 3.11's; legato supports 3.10)."""
    return toml.split(f"[{name}]\n", 1)[1].split("\n[", 1)[0]


def _runs(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` that can run: the bodies of `if TYPE_CHECKING:` are skipped."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in [child, *_runs(child)])
            continue
        yield node
        yield from _runs(node)


def imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """The legato modules that module `name` imports, as (module, line); `from pkg import mod` names the module."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in _runs(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(_known(alias.name, modules), node.lineno) for alias in node.names if alias.name.startswith("legato")]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            if module.startswith("legato"):
                found += [(_known(f"{module}.{alias.name}", modules), node.lineno) for alias in node.names]
    return found


def _known(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of `name` that is a module (`from legato.store import bases` is legato.store.bases)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _child(package: str, module: str) -> str | None:
    """The child of `package` that holds `module` (itself for the package's own __init__), or None outside it."""
    if module == package:
        return package
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1 :].split('.')[0]}"


def cycles(modules: dict[str, Path]) -> list[str]:
    """Every cycle among the children of any package, each with the imports that make it, one line per import."""
    arrows = {name: imports(name, path, modules) for name, path in modules.items()}
    packages = sorted({name for name, path in modules.items() if path.stem == "__init__"})
    problems = []
    for package in packages:
        edges: dict[tuple[str, str], list[str]] = {}
        for source, targets in arrows.items():
            a = _child(package, source)
            for target, line in targets:
                b = _child(package, target)
                if a and b and a != b:
                    edges.setdefault((a, b), []).append(f"{source}:{line} imports {target}")
        for component in _strongly_connected(edges):
            within = [f"    {how}" for (a, b), hows in sorted(edges.items()) if a in component and b in component for how in hows]
            problems.append(f"in {package}, {' <-> '.join(sorted(component))} import each other:\n" + "\n".join(within))
    return problems


def _strongly_connected(edges: dict[tuple[str, str], list[str]]) -> list[set[str]]:
    """The groups of nodes that reach each other (Tarjan's algorithm), those of more than one node."""
    after: dict[str, list[str]] = {}
    for a, b in edges:
        after.setdefault(a, []).append(b)
        after.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in after[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(after):
        if node not in index:
            visit(node)
    return groups


def outward(modules: dict[str, Path]) -> list[str]:
    """Imports of the core into legato.orchestrator or legato.slurm."""
    return [
        f"{name}:{line} imports {target}"
        for name, path in modules.items()
        if not name.startswith(OUTER)
        for target, line in imports(name, path, modules)
        if target.startswith(OUTER)
    ]


def test_no_import_climbs_a_layer_in_any_package() -> None:
    modules = package_modules(ROOT)
    assert len(modules) > 100 and "legato.session.session" in modules and "legato.slurm.backend" in modules
    assert cycles(modules) == []


def test_the_core_imports_neither_the_orchestrator_nor_slurm() -> None:
    assert outward(package_modules(ROOT)) == []


def test_nothing_imports_the_repository_folders_by_their_names() -> None:
    found = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        if ".venv" in path.parts or "build" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] in ("trainer", "slurm", "orchestrator")]
    assert found == []


def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    """A package `legato` under tmp_path with `files` (relative path -> source), read as the real one is."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"legato" = "core"\n"legato.low" = "core/low"\n'
        '"legato.high" = "core/high"\n"legato.orchestrator" = "outer"\n'
    )
    for rel, source in {
        "core/__init__.py": "",
        "core/low/__init__.py": "",
        "core/high/__init__.py": "",
        "outer/__init__.py": "",
        **files,
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    return package_modules(tmp_path)


def test_a_planted_climb_is_caught_wherever_it_hides(tmp_path: Path) -> None:
    """A climb inside a function, between two subpackages, and a cycle of modules inside one, are each named with its
    line; the same imports under TYPE_CHECKING, or pointing down, are not."""
    modules = _plant(
        tmp_path,
        {
            "core/high/top.py": "from legato.low import base\n",
            "core/low/base.py": "def f():\n    from legato.high import top\n",
            "core/low/a.py": "from . import b\n",
            "core/low/b.py": "import legato.low.a\n",
            "core/low/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from legato.high import top\n",
            "core/low/out.py": "def g():\n    import legato.orchestrator\n",
        },
    )
    found = cycles(modules)
    assert len(found) == 2, found
    climb = next(p for p in found if p.startswith("in legato,"))
    assert "legato.high <-> legato.low" in climb and "legato.low.base:2 imports legato.high.top" in climb
    inner = next(p for p in found if p.startswith("in legato.low,"))
    assert "legato.low.a <-> legato.low.b" in inner and "typed" not in "\n".join(found)
    assert outward(modules) == ["legato.low.out:2 imports legato.orchestrator"]
    (tmp_path / "core/low/base.py").write_text("import os\n")
    (tmp_path / "core/low/b.py").write_text("x = 1\n")
    assert cycles(package_modules(tmp_path)) == []

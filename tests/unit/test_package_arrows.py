"""The package graph points one way, read from the sources alone: the core (trainer/) imports neither orchestrator
nor slurm; slurm/ imports no orchestrator; nothing imports the repository folders by their own names."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_package_arrows_point_one_way() -> None:
    """core (trainer/) imports neither orchestrator nor slurm; slurm/ imports no orchestrator."""
    forbidden = {"trainer": ("legato.orchestrator", "legato.slurm"), "slurm": ("legato.orchestrator",)}
    found = []
    for folder, banned in forbidden.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)} imports {name}" for name in _imports(path) if name.startswith(banned)]
    assert found == []
    assert not any(name.startswith(("trainer", "slurm",
                                    "orchestrator")) for p in ROOT.glob("*/**/*.py") if ".venv" not in p.parts for name in _imports(p))

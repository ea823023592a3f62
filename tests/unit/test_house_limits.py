"""The house's size limits (issue 20), read from the sources: the Session class at most 300 lines, no source module over
450, the README at most 300. Each limit that a change crosses is named with its file, so the fix is to split by concern."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

SESSION_LINES, MODULE_LINES, README_LINES = 300, 450, 300
SOURCE_FOLDERS = ("trainer", "orchestrator", "slurm")


def class_lines(path: Path, name: str) -> int:
    """How many lines class `name` of `path` spans, decorators and docstring included."""
    (node,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name]
    assert node.end_lineno is not None
    return node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1


def over_limit(paths: list[Path], limit: int) -> list[str]:
    """The files of `paths` longer than `limit` lines, each with its length."""
    lengths = {path: len(path.read_text().splitlines()) for path in paths}
    return [f"{path.relative_to(ROOT)}: {n} lines" for path, n in lengths.items() if n > limit]


def test_the_session_class_every_module_and_the_readme_keep_the_house_limits() -> None:
    assert class_lines(ROOT / "trainer" / "session" / "session.py", "Session") <= SESSION_LINES
    sources = sorted(path for folder in SOURCE_FOLDERS for path in (ROOT / folder).rglob("*.py"))
    assert len(sources) > 50
    assert over_limit(sources, MODULE_LINES) == []
    assert over_limit([ROOT / "README.md"], README_LINES) == []


def test_the_limit_checks_catch_a_planted_long_class_and_module(tmp_path: Path) -> None:
    planted = tmp_path / "big.py"
    planted.write_text("@dataclass\nclass Session:\n" + "    x = 1\n" * 320)
    assert class_lines(planted, "Session") == 322
    local = ROOT / "tests" / "unit" / "test_house_limits.py"  # a real file of the repository, under a low limit
    assert over_limit([local], 10) == [f"tests/unit/test_house_limits.py: {len(local.read_text().splitlines())} lines"]

"""The suite's own layout: test modules are collected by their file's basename (tests/ folders are not packages), so
two test files of one name in two folders make pytest refuse the second ("import file mismatch"): a whole file of
tests silently not run where the suite is collected in one process. The check fails on a planted duplicate."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from conftest import ROOT


def duplicate_names(root: Path) -> list[str]:
    names = Counter(path.name for path in root.rglob("test_*.py") if "__pycache__" not in path.parts)
    return sorted(name for name, count in names.items() if count > 1)


def test_no_two_test_files_share_a_name() -> None:
    assert duplicate_names(ROOT / "tests") == []


def test_planted_duplicate_is_caught(tmp_path: Path) -> None:
    for folder in ("unit", "e2e"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_same.py").write_text("")
    assert duplicate_names(tmp_path) == ["test_same.py"]

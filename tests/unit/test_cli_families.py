"""The CLI's dispatch: every command of the grammar runs through its family's loader, and a command imports its own
family alone (`legato status` never loads submitit or the supervisor, half of each call's CPU before)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from legato.orchestrator.arguments import build_parser
from legato.orchestrator.cli import FAMILIES


def test_every_command_of_the_grammar_has_a_family_that_holds_it() -> None:
    (commands,) = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    assert set(commands.choices) == set(FAMILIES)
    for name, family in FAMILIES.items():
        assert callable(family()[name]), name


def test_status_imports_neither_submitit_nor_the_supervisor(tmp_path: Path) -> None:
    (tmp_path / "ledger.jsonl").write_text("")
    heavy = ("submitit", "legato.orchestrator.supervisor", "legato.orchestrator.commands.supervising")
    probe = (
        "import sys\nfrom legato.orchestrator.cli import main\ncode = main(['status', sys.argv[1], '--json'])\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "print('LOADED', loaded, code)"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout[: proc.stdout.rindex("LOADED")])
    assert "attempts" in summary, summary
    assert proc.stdout.rsplit("LOADED", 1)[1].split() == ["[]", "0"], proc.stdout[-500:]

"""A checkpoint's files verified by the ranks together: each rank hashes its share, and rank 0 hears every problem.

Real processes (2 ranks, gloo) run tests/helpers/verify_together.py: rank 0 verifies
through legato.session.file_checks while rank 1 serves. The planted fault is a
flipped byte in a file that rank 1 verifies, so rank 0 knows of it only from rank 1.
The assignment itself is a unit test beside it (no processes).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from conftest import ROOT, codes, run_ranks

from legato.session.file_checks import assign
from legato.store import commit

SCRIPT = ROOT / "tests" / "helpers" / "verify_together.py"


def test_every_file_is_verified_once_the_biggest_first_to_the_least_loaded_rank() -> None:
    files = {name: {"bytes": size} for name, size in {"a": 50, "b": 40, "c": 30, "d": 20, "e": 20, "f": 0}.items()}
    shares = assign(files, 2)
    assert [sorted(s) for s in shares] == [["a", "d", "e"], ["b", "c", "f"]]
    assert assign(dict(reversed(files.items())), 2) == shares  # the same on every rank, whatever the listing's order
    assert [sorted(s) for s in assign(files, 8)][:6] == [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]


def test_a_bad_file_that_rank_1_verifies_is_raised_on_rank_0(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    contents = {f"part{i}.pt": {"w": torch.randn(64 * (i + 1), 64, generator=g)} for i in range(4)}
    (tmp_path / "good").mkdir()
    files = commit.write_files(tmp_path / "good", contents)
    (tmp_path / "files.json").write_text(json.dumps(files))
    shutil.copytree(tmp_path / "good", tmp_path / "bad")
    victim = sorted(assign(files, 2)[1])[0]
    data = bytearray((tmp_path / "bad" / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "bad" / victim).write_bytes(bytes(data))

    procs = run_ranks([sys.executable, str(SCRIPT), str(tmp_path), str(tmp_path / "verdicts.json")], world_size=2)
    assert codes(procs) == [0, 0], [p.stderr[-2000:] for p in procs]
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts == {"good": "ok", "bad": f"ValueError: {victim} does not match its XXH3-128 in the manifest (corrupt)"}

"""The device rule end to end: `legato verify` of the tiny GPT with every tensor digested by the rule a GPU tensor follows
(legato.state.device_digest), so the whole proof (state hashes, replay bases, the resume's check, the replay) runs on it
in real processes, and a planted fault is still caught by it.

No GPU here, so this stands in for one, saying so: a `sitecustomize` on the runs' PYTHONPATH widens
`legato.state.hashing.DEVICE_RULE_ON` to the CPU in every process of the verify (its CLI, the jobs and their ranks).
e2e/test_cuda.py runs the real thing on a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_verify import verify

from legato.state.device_digest import RULE

pytestmark = pytest.mark.slow

WIDEN = "import legato.state.hashing as hashing\nhashing.DEVICE_RULE_ON = ('cuda', 'cpu')\n"


def on_the_rule(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WIDEN)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


def test_a_run_digested_by_the_device_rule_resumes_verified_and_its_manifests_say_so(tmp_path: Path) -> None:
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", env_extra=on_the_rule(tmp_path))
    assert code == 0, out[-3000:]
    assert verdict["identical"] and verdict["reference_final_hash"] == verdict["run_final_hash"]
    manifests = sorted((tmp_path / "verify").glob("*/checkpoints/step_*/manifest.json"))
    assert manifests and all(json.loads(m.read_text())["tensor_digests"]["cpu"] == RULE for m in manifests)


def test_a_planted_fault_is_caught_by_the_device_rule(tmp_path: Path) -> None:
    """The optimizer left unrestored: the resume's check, by the device rule's digests, names it."""
    code, verdict, out = verify(tmp_path, "--interrupt-at", "12", sets=("chaos.skip_restore=[optimizer]",), env_extra=on_the_rule(tmp_path))
    assert code == 1, out[-3000:]
    assert not verdict["identical"] and "optimizer state is missing" in verdict["cause"], verdict["cause"]

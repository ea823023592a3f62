"""`python -m legato` forks its ranks after importing what each would import (legato.runtime.launch): a forked rank
must be what a fresh interpreter started for it would be, and train the same bits.

A probe entrypoint records, as the rank starts, what a fork could get wrong: its parent and process group, argv,
the hash seed (read only as an interpreter starts: the launcher runs itself again with the ranks' seed), the stop
signal's handler as an exec leaves it (not the launcher's), numpy's global generator drawn afresh per rank. The same config
launched by `python -m legato.torchrun -m legato.runtime.rank` (ranks in fresh interpreters) must end on the same
global hash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_GPT, ROOT, TINY_GPT, manifest

from legato.runtime.launch import free_port

pytestmark = pytest.mark.slow

PROBE = """
import json
import os
import signal
import sys
import threading
from pathlib import Path

import numpy

from legato.loop import train


def main(ctx):
    # The Session's stop flag holds the stop signal by now; what it replaced is what the rank started with.
    flag = getattr(signal.getsignal(signal.SIGUSR2), "__self__", None)
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "argv0": sys.argv[0],
        "comm": Path("/proc/self/comm").read_text().strip(),
        "interpreter_argv": sys.orig_argv,  # a fork keeps the launcher's, a fresh interpreter has its own
        "hash": hash("legato"),
        "usr2_flag": type(flag).__name__,
        "usr2_at_start": str(flag._previous.get(signal.SIGUSR2)) if flag is not None else None,
        "numpy": int(numpy.random.get_state()[1][0]),
        "python_threads": threading.active_count(),
        "rank_env": os.environ["RANK"],
    }
    Path(os.environ["PROBE_DIR"], f"rank{ctx.rank}.json").write_text(json.dumps(seen))
    return train(ctx)
"""
SETS = (*FAST_GPT, "train.steps=12", "checkpoint.every_steps=6", "chaos.signal_at_steps=[]", "repro.enabled=false")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}  # the launcher must set the ranks' own
    return dict(env, PYTHONWARNINGS="ignore", PYTHONPATH=str(tmp_path), PROBE_DIR=str(tmp_path))


def test_a_forked_rank_starts_as_a_fresh_interpreter_would_and_trains_the_same_bits(tmp_path: Path) -> None:
    (tmp_path / "legato_rank_probe.py").write_text(PROBE)
    sets = [f"--set={item}" for item in (*SETS, "train.entrypoint=legato_rank_probe:main")]
    forked = tmp_path / "forked"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "legato", str(TINY_GPT), "--nproc", "2", f"--set=run.dir={forked}", *sets],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, out[-3000:]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    fresh_hash = subprocess.run(
        [sys.executable, "-c", "print(hash('legato'))"], env=dict(os.environ, PYTHONHASHSEED="0"), capture_output=True, text=True
    ).stdout
    for rank, probe in enumerate(seen):
        assert probe["ppid"] == launcher.pid and probe["pgid"] == probe["pid"] != launcher.pid, probe
        assert probe["interpreter_argv"][1:3] == ["-m", "legato"], probe  # forked, not a fresh interpreter
        assert probe["comm"] == f"legato-rank{rank}", probe  # its command line is the launcher's: its name tells it apart
        assert probe["argv0"].endswith(os.path.join("legato", "runtime", "rank.py")) and probe["rank_env"] == str(rank), probe
        assert probe["hash"] == int(fresh_hash), (probe, fresh_hash)
        assert probe["usr2_flag"] == "StopFlag" and probe["usr2_at_start"] == str(signal.Handlers.SIG_DFL), probe
        assert probe["python_threads"] == 1, probe
    assert seen[0]["numpy"] != seen[1]["numpy"], seen

    cold = tmp_path / "cold"
    command = [sys.executable, "-m", "legato.torchrun", "--max-restarts", "0", "--nproc-per-node", "2", "--master-port", str(free_port())]
    command += ["-m", "legato.runtime.rank", str(TINY_GPT), f"--set=run.dir={cold}", *sets, "--set=local.tasks=2"]
    done = subprocess.run(command, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for step in (6, 12):
        assert manifest(forked, step)["global_hash"] == manifest(cold, step)["global_hash"], step

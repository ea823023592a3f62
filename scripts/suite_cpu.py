#!/usr/bin/env python3
"""Where the test suite's CPU goes: every process the suite starts, its CPU time, grouped by what it is.

    sudo scripts/suite_cpu.py run [PYTEST ARGS]   # the suite (scripts/test.sh) under the two recorders below
    scripts/suite_cpu.py report DIR               # the table again, from a run's recordings
    scripts/suite_cpu.py report DIR --by test     # the CPU of each test (of one kind: --kind WORDS)

Two recorders, joined by pid and start time: BSD process accounting (`accton`, from the `acct` package; the
kernel writes each process's CPU time, name, pid and parent as it ends, forked children and processes that end by
`os._exit` included) and a start-up hook put into .venv for the run (a `.pth` line, which every interpreter of the
venv runs before its first line: it appends its pid and command line to a file in DIR). A forked child, which runs
no start-up, is named after its parent. The hook is removed and accounting turned off when the run ends, whatever
its outcome. A tool for the suite's developers (issue 55's "where the suite's CPU goes"): it needs root and must
never be part of the suite.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK_MODULE = "_legato_suite_cpu"
HOOK = """import os, time
try:
    with open("/proc/self/cmdline", "rb") as _c:
        # One line of words: arguments end in NULs, and `-c` code has newlines.
        _cmd = " ".join(_c.read().replace(b"\\0", b" ").decode("utf-8", "replace").split())[:400]
    with open(os.path.join({log!r}, str(os.getpid())), "a") as _f:
        _f.write("%d\\t%.3f\\t%s\\n" % (os.getpid(), time.time(), _cmd))
except OSError:
    pass
"""
START_SLACK_S = 3.0  # accounting records a start to the second
TEST_DIR = re.compile(r"/pytest-\d+/(?:popen-gw\d+/)?(test_\w+?)\d*/")  # pytest's tmp_path of a test


@dataclass(frozen=True)
class Process:
    comm: str
    cpu_s: float
    pid: int
    ppid: int
    started: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scripts/test.sh under the recorders, then print the table")
    run.add_argument("--dir", type=Path, default=None, help="where the recordings go (default: a new temporary directory)")
    report = sub.add_parser("report", help="print the table of a run's recordings")
    report.add_argument("dir", type=Path)
    report.add_argument("--by", choices=("kind", "test"), default="kind", help="group by process kind, or by the test that started it")
    report.add_argument("--kind", default="", help="with --by test: only processes of the kinds whose name holds these words")
    args, pytest_args = parser.parse_known_args()
    if args.command == "report":
        if args.by == "test":
            print_tests(args.dir, args.kind)
        else:
            print_table(args.dir)
        return 0
    out = args.dir or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    code = record(out, pytest_args)
    print_table(out)
    print(f"recordings: {out}; the suite exited {code}")
    return code


def record(out: Path, pytest_args: list[str]) -> int:
    """Run the suite with the start-up hook installed and accounting on; undo both whatever happens."""
    (out / "starts").mkdir(parents=True, exist_ok=True)
    acct = out / "acct"
    acct.touch()
    subprocess.run([str(ROOT / "scripts" / "setup.sh")], check=True)
    packages = Path(
        subprocess.check_output([str(ROOT / ".venv/bin/python"), "-c", "import site; print(site.getsitepackages()[0])"], text=True).strip()
    )
    module, pth = packages / f"{HOOK_MODULE}.py", packages / f"{HOOK_MODULE}.pth"
    subprocess.run(["accton", str(acct)], check=True)  # first: without root nothing of the venv is touched
    try:
        module.write_text(HOOK.format(log=str(out / "starts")))
        pth.write_text(f"import {HOOK_MODULE}\n")
        return subprocess.run([str(ROOT / "scripts" / "test.sh"), *pytest_args]).returncode
    finally:
        subprocess.run(["accton", "off"], check=False)
        pth.unlink(missing_ok=True)
        module.unlink(missing_ok=True)


def ended(acct: Path) -> list[Process]:
    """Every process accounting recorded, read with the acct package's `dump-acct`."""
    lines = subprocess.run(["dump-acct", str(acct)], capture_output=True, text=True, check=True).stdout.splitlines()
    found = []
    for line in lines:
        f = [x.strip() for x in line.split("|")]
        if len(f) < 15:
            continue
        started = time.mktime(datetime.strptime(f[14], "%a %b %d %H:%M:%S %Y").timetuple())
        found.append(Process(f[0], (float(f[2]) + float(f[3])) / 100, int(f[9]), int(f[10]), started))
    return found


def starts(log: Path) -> dict[int, list[tuple[float, str]]]:
    """pid -> (time, command line) of each interpreter start the hook saw."""
    seen: dict[int, list[tuple[float, str]]] = collections.defaultdict(list)
    for path in log.iterdir():
        for line in path.read_text(errors="replace").splitlines():
            pid, at, cmd = (line.split("\t", 2) + ["", ""])[:3]
            if pid.isdigit():  # not the tail of a `-c` command line split at its newlines (a log of an older hook)
                seen[int(pid)].append((float(at), cmd.replace("\0", " ")))  # an older hook kept the NULs
    return seen


def command_of(p: Process, seen: dict[int, list[tuple[float, str]]]) -> tuple[str, bool]:
    """The command line of `p`, and whether it is its parent's (a forked child); "" when neither started here."""
    own = [(abs(at - p.started), cmd) for at, cmd in seen.get(p.pid, []) if abs(at - p.started) <= START_SLACK_S]
    if own:
        return min(own)[1], False
    parent = [(at, cmd) for at, cmd in seen.get(p.ppid, []) if at <= p.started + START_SLACK_S]
    return (max(parent)[1], True) if parent else ("", False)


def kind(p: Process, cmd: str, forked: bool, forks_ranks: bool) -> str:
    """What a process is, in the table's words."""
    if p.comm == "pt_data_worker" or (forked and "multiprocessing" in cmd):
        return "DataLoader workers (forked)"
    if p.comm in ("cc1plus", "as", "ld", "collect2", "g++", "cc1"):
        return "C++ compiler (torch.compile's kernels)"
    if p.comm.startswith("legato-rank") and not cmd:
        return "ranks forked by a `python -m legato` launcher"
    if "warm.py" in cmd:
        return "ranks forked warm by the suite's server (tests/helpers/warm.py)" if forked else "the suite's warm server"
    if "exec(eval(sys.stdin" in cmd or "-m pytest" in cmd:
        return "pytest: its controller and workers"
    if "submitit.core._submit" in cmd:
        if forked:
            return "ranks forked by a local job's task"
        return "local `legato run` job tasks (fork their ranks)" if forks_ranks else "SLURM tasks (each a rank, started cold by srun)"
    if "submitit.local._local" in cmd:
        return "local job controllers (submitit)"
    if "legato.torchrun" in cmd or "torch.distributed.run" in cmd or re.search(r"/torchrun\b", cmd):
        return "torchrun and `python -m legato.torchrun` launchers"
    if re.search(r"-m legato( |$)", cmd):
        return "ranks forked by a `python -m legato` launcher" if forked else "`python -m legato` launchers, started cold"
    if "legato.orchestrator.cli" in cmd or re.search(r"/bin/legato\b", cmd):
        return "legato CLI commands"
    if "multiprocessing" in cmd:
        return "multiprocessing spawn and forkserver processes"
    if re.search(r"mypy|pip|ruff", cmd) or p.comm in ("ruff", "pip"):
        return "setup, lint, types"
    if "bench_" in cmd:
        return "benchmark scripts (smoke mode)"
    if re.search(r"\.py\b", cmd) and not forked:
        return "scripts started cold: ranks under torchrun or srun, and runs a test starts cold"
    if cmd:
        return "other Python (python -c, helpers)"
    return "other processes (git, shells, SLURM daemons, ...)"


def classified(out: Path) -> list[tuple[Process, str, str]]:
    """Every process of a run's recordings with its command line ("" when unknown) and kind."""
    procs, seen = ended(out / "acct"), starts(out / "starts")
    forkers = collections.Counter(p.ppid for p in procs if p.comm.startswith("legato-rank"))
    found = []
    for p in procs:
        cmd, forked = command_of(p, seen)
        found.append((p, cmd, kind(p, cmd, forked, forkers[p.pid] > 0)))
    return found


def test_of(cmd: str) -> str:
    """The test whose temporary directory a command line names (pytest's `tmp_path`: the test's name, cut at 30
    characters, and a number), else ""."""
    found = TEST_DIR.search(cmd)
    return found.group(1) if found else ""


def print_table(out: Path) -> None:
    procs = classified(out)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for p, _, name in procs:
        row = totals[name]
        row[0] += 1
        row[1] += p.cpu_s
    whole = sum(cpu for _, cpu in totals.values()) or 1.0
    print(f"| {'CPU s':>7} | {'share':>6} | {'processes':>9} | kind")
    print(f"| {'---':>7} | {'---':>6} | {'---':>9} | ---")
    for name, (count, cpu) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"| {cpu:7.0f} | {100 * cpu / whole:5.1f}% | {int(count):9d} | {name}")
    print(f"| {whole:7.0f} | 100.0% | {len(procs):9d} | all")


def print_tests(out: Path, kind_words: str, rows: int = 40) -> None:
    """The CPU of the processes each test started (of the kinds named `kind_words`), most first. A process whose command
    line names no test directory (a launcher given a run directory elsewhere, the suite's own) counts as "(no test
    named)"."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for p, cmd, name in classified(out):
        if kind_words in name:
            row = totals[test_of(cmd) or "(no test named)"]
            row[0] += 1
            row[1] += p.cpu_s
    print(f"| {'CPU s':>7} | {'processes':>9} | test (its tmp_path's name, cut at 30 characters)")
    print(f"| {'---':>7} | {'---':>9} | ---")
    for name, (count, cpu) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:rows]:
        print(f"| {cpu:7.1f} | {int(count):9d} | {name}")


if __name__ == "__main__":
    sys.exit(main())

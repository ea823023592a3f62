"""Shell completion as a user installs it: `eval "$(legato completion bash)"` in a real bash, then what a TAB offers
after each partial command line (bash's own completion variables and `compgen`)."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from conftest import ROOT
from helpers.cli import legato

# (the words typed, the last one partial) -> what the TAB offers
CASES = [
    (["legato", "re"], ["repro", "requeue"]),
    (["legato", "repro", "d"], ["diff"]),
    (["legato", "devcluster", ""], ["up", "down", "status"]),
    (["legato", "completion", ""], ["bash", "zsh"]),
    (["legato", "run", "--s"], ["--set"]),
    (["legato", "verify", "--executor", ""], ["local", "slurm"]),
    (["legato", "repro", "diff", "--"], ["--help", "--run"]),
    (["legato", "status", "--json", "conf"], ["configs"]),  # a run directory: file names
]


def offered(script: str, words: list[str], shell: str = "bash") -> list[str]:
    """What the completion function sets COMPREPLY to for `words`, run from the repository's root."""
    array = " ".join(shlex.quote(w) for w in words)
    probe = f'COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _legato_complete; printf "%s\\n" "${{COMPREPLY[@]}}"'
    if shell == "zsh":  # as zsh's bashcompinit calls a bash completion function: sh emulation, arrays from 0
        probe = f"probe() {{\n emulate -L sh\n setopt kshglob noshglob braceexpand\n {probe}\n}}\nprobe"
    cmd = [shell, "-c", f"{script}\n{probe}"] if shell == "bash" else [shell, "-f", "-c", f"{script}\n{probe}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


@pytest.mark.parametrize(("words", "expected"), CASES, ids=[" ".join(w) for w, _ in CASES])
def test_bash_completes_subcommands_flags_and_choices(words: list[str], expected: list[str]) -> None:
    proc = legato("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert offered(proc.stdout, words) == expected


def test_every_subcommand_is_offered_and_a_bad_shell_is_refused() -> None:
    subcommands = offered(legato("completion", "bash").stdout, ["legato", ""])
    assert "completion" in subcommands and "run" in subcommands and "repro" in subcommands, subcommands
    proc = legato("completion", "fish")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "bash" in proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed here (apt-get install zsh)")
def test_zsh_loads_the_same_completion() -> None:
    proc = legato("completion", "zsh")
    assert proc.returncode == 0, proc.stderr
    # zsh's compgen stand-in hands every candidate of the level over and zsh's own matcher filters by what was typed:
    # the walk down to `repro` is what this shows.
    assert offered(proc.stdout, ["legato", "repro", "d"], shell="zsh") == ["show", "diff", "capture"]
    assert offered(proc.stdout, ["legato", "devcluster", ""], shell="zsh") == ["up", "down", "status"]

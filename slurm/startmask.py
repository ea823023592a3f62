"""Start a task's Python with the stop signals blocked, so a signal during start-up waits instead of killing it.

SLURM sends the stop signal as soon as the time left is within the lead plus
its 30 s check interval, which can be seconds after the task starts: before
Python has imported anything, when the signal's default action still ends
the process. A blocked signal stays pending, and the signal mask survives
exec, so submitit starts each task as `python -I -S startmask.py SIGNUMS`
followed by its own arguments: this script blocks SIGNUMS and execs the real
interpreter. The trainer's stop handler unblocks them once it is installed
(`legato.dist.stop.StopFlag.install`), and a signal held since start-up is
delivered to it then. The script imports only builtins (it runs under -S)
and never does anything but block and exec.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Iterable


def launcher(signal_names: Iterable[str]) -> str:
    """The `python` command for submitit's executors: this script, blocking the named signals, in front of the interpreter."""
    signals = {signal.Signals[f"SIG{name.upper().removeprefix('SIG')}"] for name in signal_names}
    numbers = ",".join(str(int(s)) for s in sorted(signals))
    return shlex.join([sys.executable, "-I", "-S", os.path.abspath(__file__), numbers])


def main(argv: list[str]) -> None:
    """Block the signals numbered in argv[0] (comma-separated), then exec the interpreter on the rest of argv."""
    numbers, command = argv[0], argv[1:]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.Signals(int(n)) for n in numbers.split(",") if n})
    os.execv(sys.executable, [sys.executable, *command])


if __name__ == "__main__":
    main(sys.argv[1:])

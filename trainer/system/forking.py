"""A child process forked from this one and handled as a `subprocess.Popen` is (pid, poll, wait, send_signal).

The local launcher forks its ranks after importing, once, what every rank imports (legato.runtime.launch), where a
`Popen` of a fresh interpreter would import it again in each. What a fork cannot give the child is what an exec
gives it: the environment read at interpreter start, `sys.argv`, signal handlers reset to their defaults. The caller
makes those right in `become` (which runs first in the child), and `fork_run` resets the one handler the caller
names. The child never returns into its parent's code: it runs `run` and ends as `sys.exit` would end it in a fresh
interpreter, less the teardown of what it inherited (`legato.system.exiting`). This module must never fork with Python
threads of its own running, nor import anything of legato's above the system layer.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from legato.system.exiting import finish, inherit_files, open_files

_WAIT_POLL_S = 0.05
PR_SET_NAME = 15
FORKS = sys.platform.startswith("linux")  # where legato forks ranks warm; elsewhere each starts a fresh interpreter
# Looked up here, in the parent: between fork and the child's first line nothing dlopens or dlsyms.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if FORKS else None


class ForkedProcess:
    """A forked child, with `subprocess.Popen`'s API for what the launcher uses."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid, self.args = pid, list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the child ended (negative: the signal that killed it), else None; reaps it."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(_WAIT_POLL_S)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def name_this_process(name: str) -> None:
    """Name this process (its `comm`, at most 15 bytes: what `ps -o comm`, `top` and `pgrep` show): a forked child
    otherwise shows its parent's name and command line. A no-op elsewhere than Linux."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def fresh_numpy_seed() -> None:
    """numpy's global generator drawn from the OS, as a fresh interpreter's is (Python's `random` reseeds itself after a
    fork; torch's default generator starts from its fixed seed either way, and a forking parent draws nothing from it)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def fork_run(
    args: Sequence[str], become: Callable[[], None], run: Callable[[], int], default_handlers: Sequence[signal.Signals] = ()
) -> ForkedProcess:
    """Fork a child that resets `default_handlers` to SIG_DFL (as an exec would), calls `become`, then `run`, and
    exits with what `run` returned; in the parent, the child as a ForkedProcess (`args`: what it is, for messages).
    Open files are flushed first, so that nothing buffered before the fork is written twice, and the child flushes
    them again as it ends (legato.system.exiting), with those it opened."""
    files = open_files()
    for file in (sys.stdout, sys.stderr, *files):
        with contextlib.suppress(Exception):  # closed, read-only, a broken pipe
            file.flush()
    # What this process holds goes to the collector's permanent generation for the fork, the pattern the `gc.freeze`
    # docs give for a fork without exec: the child's collections, the census's sweep (legato.state.census) and its
    # exit's look for open files pass over the ~290k objects torch's import made (0.1 s of CPU each time) and leave the
    # pages it shares with its parent unwritten. The parent takes them back at once.
    gc.freeze()
    pid = os.fork()
    if pid:
        gc.unfreeze()
        return ForkedProcess(pid, args)

    def child() -> int:
        inherit_files(files)
        for sig in default_handlers:
            signal.signal(sig, signal.SIG_DFL)
        become()
        return run()

    finish(child)

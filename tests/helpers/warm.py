"""Ranks started warm: the scripts the suite runs by path (`python script.py ...` under a test's own RANK and
WORLD_SIZE) are forked from a server that has already imported torch and what DDP and fully_shard import as they wrap
a model, instead of each paying those imports again: 2.6 s of CPU per rank, about three quarters of a rank's CPU in
the suite, and most of the suite's time on two cores.

A warm rank is the script's own process, with its own pid (signals sent to it from outside reach it, and nothing
else), its environment, arguments, working directory and standard streams as `subprocess.Popen` would give them,
its exit code or killing signal as Popen reports them; it starts in a process group of its own. It ends as legato's
own forked ranks do (legato.system.exiting: the interpreter's exit without the teardown of what the server imported,
1.2 s of CPU a rank). What it cannot have is a fresh interpreter, so a command is started cold (a real Popen)
whenever that could show:

- anything but `python script.py ...` or `python -m legato ...` (another `-m`, `-c`): torchrun, legato's other
  launchers and the CLI always start cold. `python -m legato`, the local launcher, starts warm only as
  `conftest.run_trainer` starts it to train a run that a test then reads; the tests of how it starts and stops
  processes (test_launcher_signals, test_orphans, test_worker_start_methods) start it with `subprocess.Popen`;
- an environment that differs from the server's in a variable read when Python or torch starts (PYTHON*, OMP_*,
  MKL_*, KMP_*, TORCH*, CUDA*, CUBLAS*, LD_*; PYTHONPATH is applied as the interpreter would);
- LEGATO_TEST_WARM=0 in the suite's environment, which starts every rank cold, or in a command's own (a test whose
  ranks must start cold: one whose subject is the interpreter's own exit, which a warm rank skips).

tests/e2e/test_warm_start.py shows a warm and a cold start of one DDP script end bitwise equal, and each rule above.
This module must never be used to start a process whose start is what a test checks.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from legato.system.exiting import finish
from legato.system.forking import ForkedProcess

# Read at interpreter or torch start-up: a rank whose value differs from the server's starts cold.
READ_AT_START = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "CUDA", "CUBLAS", "LD_")
WARM_MODULES = ("legato",)  # `python -m MODULE ...` that may start warm (see the rules above)
SERVER_ENV = {"PYTHONHASHSEED": "0", "PYTHONWARNINGS": "ignore"}  # what the suite gives every rank it starts by path
_POLL_S = 0.05


class WarmRank(ForkedProcess):
    """A rank forked by the warm server, handled as a `subprocess.Popen` is (pid, poll, wait, send_signal, kill). Not
    this process's child: its exit code comes from the server, which reaps it."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        super().__init__(pid, args)
        self._conn = conn

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _status(self, timeout: float | None) -> int | None:
        """The exit code once the server reported it (waiting up to `timeout` seconds, None for ever)."""
        if self.returncode is None and select.select([self._conn], [], [], timeout)[0]:
            reply = self._conn.recv(64)
            self._conn.close()
            if not reply:  # the server died (killed from outside) before its child ended: its exit code is lost
                raise RuntimeError(f"the warm server of rank pid {self.pid} ended before the rank did; its exit code is unknown")
            self.returncode = int(reply.decode())
        return self.returncode


class _Server:
    """The per-process warm server: started on first use, killed when this process exits."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="warm-ranks-")
        self.path = os.path.join(self.dir, "socket")
        self.env = _fresh_env()
        # Its own process group (a Ctrl-C to the suite's does not reach it), in the suite's session: a new session would
        # put every warm rank in a scheduler autogroup of its own, sharing one CPU share among them where cold ranks
        # compete as the suite's processes do, and a loaded machine would then deschedule their threads for longer.
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], env=self.env, preexec_fn=os.setpgrp, stdin=subprocess.DEVNULL)
        atexit.register(self.close)

    def connect(self, timeout: float = 120) -> socket.socket:
        """A connection to the server, waiting for it to listen (its imports take a few seconds)."""
        deadline = _now() + timeout
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                conn.connect(self.path)
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                if self.proc.poll() is not None or _now() > deadline:
                    raise RuntimeError(f"the warm rank server did not start (exit {self.proc.poll()})") from None
                select.select([], [], [], _POLL_S)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)


_server: _Server | None = None


def _now() -> float:
    return os.times().elapsed


def server_env() -> dict[str, str]:
    """The environment the warm server started with (or will start with). Not the test's name that pytest sets: the
    server outlives the test that started it, and each rank gets its own test's environment, name included
    (tests/conftest.py kills what a test left behind by that name)."""
    return _server.env if _server is not None else _fresh_env()


def _fresh_env() -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **SERVER_ENV}.items() if k != "PYTEST_CURRENT_TEST"}


def warm_enough(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether `cmd` under `env` may start warm (see the module's rules)."""
    if "0" in (os.environ.get("LEGATO_TEST_WARM"), env.get("LEGATO_TEST_WARM")):
        return False
    if len(cmd) < 2 or cmd[0] != sys.executable or not (_a_script(cmd) or _a_warm_module(cmd)):
        return False
    server = server_env()
    keys = {k for k in {*server, *env} if k.startswith(READ_AT_START) and k != "PYTHONPATH"}
    return all(server.get(k) == env.get(k) for k in keys)


def _a_script(cmd: list[str]) -> bool:
    return cmd[1].endswith(".py") and Path(cmd[1]).is_file()


def _a_warm_module(cmd: list[str]) -> bool:
    return len(cmd) > 2 and cmd[1] == "-m" and cmd[2] in WARM_MODULES


def start(cmd: list[str], env: dict[str, str], stdout: IO | None = None, stderr: IO | None = None, cwd: str | None = None) -> Any:
    """`cmd` started as `subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, cwd=cwd)` would, warm where it
    may (a WarmRank), else cold (a Popen)."""
    if not warm_enough(cmd, env):
        return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, cwd=cwd, text=True)
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
    conn = _server.connect()
    fds = [0, (stdout or sys.stdout).fileno(), (stderr or sys.stderr).fileno()]
    request = {"argv": cmd, "env": env, "cwd": cwd or os.getcwd()}
    socket.send_fds(conn, [json.dumps(request).encode()], fds)
    return WarmRank(cmd, int(conn.recv(64).decode()), conn)


# The server side: runs as `python warm.py SOCKET`.


def _serve(path: str) -> tuple[dict, list[int]]:
    """Import what ranks import, then fork a child per request; returns only in a child, with its request and streams."""
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401  (DDP's __init__ imports it)
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import legato.session.session  # noqa: F401

    del torch
    # No thread may run at a fork: none of those imports starts one (tests/e2e/test_warm_start.py checks).
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    running: dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the suite's worker is gone: so is its server
        if select.select([listener], [], [], _POLL_S)[0]:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            gc.freeze()  # as legato's own forks do (legato.system.forking.fork_run)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in [conn, *running.values()]:
                    other.close()
                return json.loads(message), fds
            gc.unfreeze()
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            running[pid] = conn
        _reap(running)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sys.exit(0)


def _reap(running: dict[int, socket.socket]) -> None:
    """Every child that ended: its exit code (negative: the signal that killed it) sent to whoever started it."""
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """Turn this fork into `python script.py args` (or `python -m module args`) with the request's streams, environment
    and directory."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = request["argv"][1:]
    module = args[1] if args[0] == "-m" else None
    sys.argv = [module, *args[2:]] if module else args  # runpy puts the module's file first, as `-m` does
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:1] = [os.getcwd() if module else os.path.dirname(os.path.abspath(args[0])), *extra]
    import runpy

    import numpy

    numpy.random.seed()  # drawn from the OS, as a fresh interpreter's is (Python's `random` reseeds itself after a fork)
    _settle_after_destroy()
    if module:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(args[0], run_name="__main__")


def _settle_after_destroy() -> None:
    """Make `dist.destroy_process_group()` wait for gloo's workers to park (legato.dist.quiesce.settle: sleeps, the GIL
    free), so a plain DDP script does not deadlock as its `main()` returns.

    torch 2.13's race, not legato's: a bucket all-reduce started during backward holds a Python object (the context
    `_engine_run_backward` stashes), and a gloo worker that lets go of it late needs the GIL; when `main()` returns and
    frees the DDP model, the main thread joins that worker holding the GIL. A warm rank's epilogue is faster than a cold
    one's (nothing left to import), which makes the late worker common on a loaded machine: 2 of 9 warm plain runs of
    examples/port/ddp_tutorial_plain.py beside two busy loops hung, 0 of 40 cold. A Session does the same wait as its
    loop ends (legato.dist.peers), which covers ported scripts in a cold start too."""
    import torch.distributed as dist

    from legato.dist.quiesce import settle

    destroy = dist.destroy_process_group

    def destroy_then_settle(*args: Any, **kwargs: Any) -> None:
        destroy(*args, **kwargs)
        settle()

    dist.destroy_process_group = destroy_then_settle


if __name__ == "__main__":
    request, fds = _serve(sys.argv[1])
    finish(lambda: _become(request, fds))

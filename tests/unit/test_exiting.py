"""legato's processes end as `sys.exit` ends an interpreter (legato.system.exiting): the exit code or killing signal,
the traceback of what was not caught, the non-daemon threads joined before the atexit hooks run, and the bytes of a
file never closed on disk (one the child opened, and one its parent opened before the fork). Each scenario runs in a
real child forked by `fork_run` from a fresh interpreter, and in a fresh interpreter ended at its exit by `end_at_exit`
after its main returned (as submitit's task runner does); the same scenarios in a fresh interpreter of their own are
the reference, and a child ended by a bare `os._exit` is the planted fault the file check catches."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIO = r"""
import atexit, os, signal, sys, threading, time

out = sys.argv[2]
kept = []
# Opened and written to before main runs: in a forked child, by its parent before the fork (legato.system.forking),
# whose buffer must reach the file once, not once from each process.
inherited = open(os.path.join(out, "inherited.txt"), "w")
inherited.write("before main, ")


def record(what):
    with open(os.path.join(out, "order.txt"), "a") as f:
        f.write(what + "\n")


def main():
    # Files opened in the child and never closed, held by a global: their teardown would flush them.
    kept.append(open(os.path.join(out, "unclosed.txt"), "w"))
    kept[-1].write("written, never flushed")
    kept.append(open(os.path.join(out, "unclosed.bin"), "wb"))
    kept[-1].write(b"bytes")
    inherited.write("written by main")
    ready = threading.Event()

    def late():
        ready.wait(timeout=60)
        time.sleep(0.3)  # past main's return: only a join at exit puts this line before atexit's
        record("thread")

    threading.Thread(target=late).start()  # not a daemon: the exit waits for it
    atexit.register(record, "atexit")
    ready.set()
    how = sys.argv[1]
    if how == "return-3":
        return 3
    if how == "return-none":
        return None
    if how == "exit-message":
        sys.exit("the message")
    if how == "exit-263":
        sys.exit(263)
    if how == "raise":
        raise ValueError("planted")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "interrupted-join":  # a Ctrl-C while the exit joins this thread: reported, and the exit goes on
        main_thread = threading.main_thread().ident

        def interrupt_the_join():
            while sys._current_frames()[main_thread].f_code.co_name not in ("_wait_for_tstate_lock", "_shutdown"):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(600)  # abandoned by the exit

        threading.Thread(target=interrupt_the_join).start()
        return 3
    if how == "bare-os-exit":  # the planted fault: no flush, no thread joined, no atexit
        os._exit(0)
"""

DRIVER = r"""
import sys
from legato.system.forking import fork_run
namespace = {"__name__": "scenario"}
exec(open(sys.argv[3]).read(), namespace)
child = fork_run(["scenario"], lambda: None, namespace["main"])
print(child.wait(timeout=120))
"""

AT_EXIT = r"""
import os, sys
from legato.system.exiting import end_at_exit
namespace = {"__name__": "scenario"}
exec(open(sys.argv[3]).read(), namespace)
code = namespace["main"]() or 0
end_at_exit(code)
runner = sys.argv[4] if len(sys.argv) > 4 else "writes"
if runner == "fails":  # the runner's own write after the function returned fails (a full disk) and nothing catches it
    raise OSError("planted: the result could not be written")
if runner == "interrupted":  # a Ctrl-C lands in the runner's write
    raise KeyboardInterrupt
with open(os.path.join(sys.argv[2], "result.txt"), "w") as f:  # what the runner writes after the function returned
    f.write("result")
sys.exit(code)
"""

FRESH = r"""
import sys
namespace = {"__name__": "scenario"}
exec(open(sys.argv[3]).read(), namespace)
sys.exit(namespace["main"]())
"""


DRIVERS = {"forked": DRIVER, "at-exit": AT_EXIT, "fresh": FRESH}


def run(tmp_path: Path, how: str, mode: str = "forked", *driver: str) -> tuple[int, str, Path]:
    """The scenario `how` run as `mode` (DRIVERS, given `driver`'s arguments): its exit code (negative: the signal),
    stderr and output folder."""
    out = tmp_path / mode / how
    out.mkdir(parents=True)
    scenario = tmp_path / "scenario.py"
    scenario.write_text(SCENARIO)
    command = [sys.executable, "-c", DRIVERS[mode], how, str(out), str(scenario), *driver]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180)
    returncode = int(proc.stdout.strip()) if mode == "forked" else proc.returncode
    return returncode, proc.stderr, out


def assert_ended_in_order(out: Path, where: str) -> None:
    assert (out / "order.txt").read_text() == "thread\natexit\n", where
    assert (out / "unclosed.txt").read_text() == "written, never flushed", where
    assert (out / "unclosed.bin").read_bytes() == b"bytes", where
    assert (out / "inherited.txt").read_text() == "before main, written by main", where


@pytest.mark.parametrize(
    ("how", "code", "stderr"),
    [
        ("return-3", 3, ""),
        ("return-none", 0, ""),
        ("exit-message", 1, "the message\n"),
        ("exit-263", 7, ""),
        ("raise", 1, "ValueError: planted"),
        ("interrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
def test_a_forked_child_ends_as_a_fresh_interpreter_would(tmp_path: Path, how: str, code: int, stderr: str) -> None:
    for where in ("fresh", "forked"):
        returncode, err, out = run(tmp_path, how, where)
        assert returncode == code, f"{where}: {returncode}\n{err}"
        assert stderr in err and (stderr or err == ""), f"{where}: {err!r}"
        assert_ended_in_order(out, where)
        if how == "raise":
            assert "Traceback (most recent call last)" in err, where


@pytest.mark.parametrize(("how", "code"), [("return-3", 3), ("return-none", 0)])
def test_a_process_ended_at_its_exit_keeps_its_code_hooks_threads_and_files(tmp_path: Path, how: str, code: int) -> None:
    """`end_at_exit` in a main legato does not own: the runner's own writes after the function returned still happen,
    and so does everything an exit promises; the hook registered before it (the scenario's) still runs."""
    returncode, err, out = run(tmp_path, how, "at-exit")
    assert returncode == code, err
    assert err == "" and (out / "result.txt").read_text() == "result"
    assert_ended_in_order(out, "at-exit")


@pytest.mark.parametrize(
    ("runner", "code", "stderr"), [("fails", 1, "OSError: planted"), ("interrupted", -signal.SIGINT, "KeyboardInterrupt")]
)
def test_a_runner_that_fails_after_the_function_returned_ends_as_the_interpreter_says(
    tmp_path: Path, runner: str, code: int, stderr: str
) -> None:
    """The function returned 0 and `end_at_exit(0)` was called; then the runner's own write raised and nothing caught
    it: the interpreter's verdict stands (1 after the traceback, or death by SIGINT), never the 0 registered before."""
    returncode, err, out = run(tmp_path, "return-none", "at-exit", runner)
    assert returncode == code, err
    assert "Traceback (most recent call last)" in err and stderr in err, err
    assert_ended_in_order(out, "at-exit")


def test_a_ctrl_c_while_the_exit_joins_a_thread_is_reported_and_the_exit_goes_on(tmp_path: Path) -> None:
    """Never back in the caller's frames (in a forked child, its parent's: the driver would print twice), and the
    atexit hooks still run, as in a fresh interpreter."""
    for where in ("fresh", "forked"):
        returncode, err, out = run(tmp_path, "interrupted-join", where)
        assert returncode == 3 and "KeyboardInterrupt" in err, f"{where}: {returncode}\n{err}"
        assert (out / "order.txt").read_text() == "atexit\n", where


def test_the_file_check_catches_a_child_that_skips_the_orderly_end(tmp_path: Path) -> None:
    returncode, _, out = run(tmp_path, "bare-os-exit")
    assert returncode == 0
    assert (out / "unclosed.txt").read_text() == "" and (out / "unclosed.bin").read_bytes() == b""
    assert (out / "inherited.txt").read_text() == "before main, "  # the parent's own flush
    assert not (out / "order.txt").exists() or "atexit" not in (out / "order.txt").read_text()

"""How legato's own processes end: as `sys.exit` ends an interpreter, without tearing down what they imported.

A process that imported torch spends about a second of CPU on the interpreter's teardown as it exits (its last
collections free every object, module by module), and a child forked from such a process more: each of those writes
lands on a page the child still shares with its parent, so the kernel copies the page first. Measured on a two-core
machine: a fresh interpreter that imported what a rank imports, 1.2 s of its 6.3 s; a forked child that imported
nothing after the fork, 1.3-1.5 s against 0.1 s ended here, more than a small rank spends training. The language does
not promise that teardown (a `__del__` of an object still alive at exit need not run). What an exit does promise is
kept, in the interpreter's own order:

1. the outcome: an uncaught exception's traceback through `sys.excepthook` and exit 1, `SystemExit`'s code read as
   the interpreter reads it (None 0, an int itself, anything else printed to stderr and 1), an uncaught
   KeyboardInterrupt ending the process by SIGINT;
2. the non-daemon threads joined (`threading._shutdown`, which the interpreter calls first as it exits);
3. the atexit callbacks (logging's flush, multiprocessing's children, `weakref.finalize`);
4. every open file object flushed, as an unclosed file's teardown would write it (a forked child's: those it opened
   and those its parent held at the fork), the standard streams last; one of those that cannot be flushed makes the
   exit code 120, as it does the interpreter's.

Daemon threads stop where they stand, as at any exit. Files are flushed, not closed: closing one under a daemon thread
still writing to it would hand that thread an error the interpreter's exit (which stops daemon threads first) never
gives. Used by legato's entry points (`python -m legato`, `legato.torchrun`, `legato.runtime.rank`), the ranks legato
forks and a legato job's submitit task (`end_at_exit`). This module must never end a user's own script: its
interpreter's exit is the user's, and the reference these are compared with (tests/unit/test_exiting.py).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

EXIT_FLUSH_FAILED = 120  # the interpreter's code when a standard stream cannot be flushed at exit
_inherited: list[Any] = []  # the files a forked child's parent held at the fork (`inherit_files`)


def finish(main: Callable[[], int | None]) -> NoReturn:
    """Run `main` in this process and end the process with its outcome (see the module's docstring). Nothing escapes:
    an exception a signal raises while the exit runs (a Ctrl-C during the join) ends the process all the same, never
    in the caller's frames (in a forked child, its parent's)."""
    code, interrupted = 1, False
    try:
        code, interrupted = _outcome(main)
        _step(threading._shutdown)  # type: ignore[attr-defined]  # the interpreter's own join of non-daemon threads
        _step(atexit._run_exitfuncs)
    finally:
        _end(code, interrupted)


def end_at_exit(code: int) -> None:
    """End this process with `code` as `finish` would, at the interpreter's exit, where legato does not own the main
    (submitit's task runner, which writes its result after legato's function returned): call it just before returning
    or raising `SystemExit(code)`. The hook registered here runs first of all atexit hooks (they run in reverse order of
    registration), after the interpreter joined the non-daemon threads; it runs the others, flushes and ends. When what
    runs after the call raises and nothing catches it (the runner's own write fails, a Ctrl-C lands in it), the
    interpreter's verdict stands, not `code`: exit 1 after its traceback, or death by SIGINT."""
    before = getattr(sys, "last_value", None)  # the interpreter sets it as it reports an uncaught exception

    def end() -> None:
        atexit.unregister(end)
        atexit._run_exitfuncs()
        uncaught = getattr(sys, "last_value", None)
        if uncaught is not None and uncaught is not before:
            _end(1, isinstance(uncaught, KeyboardInterrupt))
        _end(code, False)

    atexit.register(end)


def _end(code: int, interrupted: bool) -> NoReturn:
    """Steps 4 and after: the files flushed, then the process ended with `code` (by SIGINT when `interrupted`)."""
    try:
        _flush_open_files()
        if not _flushed_standard_streams():
            code = EXIT_FLUSH_FAILED
        if interrupted:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code)


def _step(run: Callable[[], object]) -> None:
    """One step of the exit; what it raises (a Ctrl-C during the join) is reported and the exit goes on, as the
    interpreter's does."""
    try:
        run()
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc, exc.__traceback__)


def _outcome(main: Callable[[], int | None]) -> tuple[int, bool]:
    """`main`'s exit code, and whether an uncaught KeyboardInterrupt ended it."""
    try:
        return _exit_code(main()), False
    except SystemExit as stop:
        return _exit_code(stop.code), False
    except BaseException as exc:  # what the interpreter does with anything uncaught: print it, exit 1
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return 1, isinstance(exc, KeyboardInterrupt)


def _exit_code(code: Any) -> int:
    """The process's exit status for `sys.exit(code)`, as the interpreter derives it (printing a non-int code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


def _flush_open_files() -> None:
    """Flush every file object still open but the standard streams (a text file flushes its buffer too): those the
    collector lists, and those a forked child's parent held at the fork."""
    for file in [*_inherited, *open_files()]:
        with contextlib.suppress(Exception):  # closed, read-only, a broken pipe: nothing an exit reports
            if not file.closed:
                file.flush()


def open_files() -> list[Any]:
    """The file objects the collector lists, standard streams aside: in a child `legato.system.forking` forked, those
    made since the fork (what it inherited sits in the collector's permanent generation, which this leaves unwalked).
    Selected by class, each class once and the objects in C (map, compress): `isinstance` would read `__class__`, and
    a check per object through `io.IOBase`'s ABC costs 0.2 s of CPU in a process that imported torch."""
    standard = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    objects = gc.get_objects()
    classes = list(map(type, objects))
    files: Iterable[Any]
    try:
        kinds = {cls for cls in set(classes) if issubclass(cls, io.IOBase)}
        files = itertools.compress(objects, map(kinds.__contains__, classes))
    except TypeError:  # a class whose metaclass makes it unhashable defeats the set: one object at a time
        files = (obj for obj, cls in zip(objects, classes) if issubclass(cls, io.IOBase))
    return [file for file in files if id(file) not in standard]


def inherit_files(files: list[Any]) -> None:
    """In a forked child: `files`, open in its parent at the fork (`open_files` there), are flushed at its end too."""
    _inherited[:] = files


def _flushed_standard_streams() -> bool:
    """Flush stdout and stderr; whether both could be (the interpreter's exit turns a failure into code 120)."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception:
            ok = False
    return ok

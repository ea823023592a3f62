"""Rank 0's voice: the few lines a person must see reach stderr even when the script configured no logging.

A resume and its verification, and a stop, are news a person running a plain
script has to see. `say` logs them as usual when logging would show them at
INFO; otherwise, on rank 0 only, it emits them through its own stderr
handler (`legato: ...`). `refuse` does the same at ERROR for the paragraph
that ends every rank (a resume that did not verify: one verdict the ranks
reached together, said once). `refusing` wraps the public entry points of a
user's script: a UsageError leaving one is said by each rank that raised it
(a problem may be one rank's own), and ends an uncaught script with exit 2
and no traceback. It must never show a line twice on one rank.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from legato.errors import UsageError, UsageRefused

_VOICE = "legato.voice"
Entry = TypeVar("Entry", bound=Callable)
# True inside `refusals_said_by_caller`: legato's own rank entry says a refusal, once.
_CALLER_SAYS: ContextVar[bool] = ContextVar("legato_refusals_said_by_caller", default=False)


def _voice() -> logging.Logger:
    voice = logging.getLogger(_VOICE)
    if not voice.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("legato: %(message)s"))
        voice.addHandler(handler)
        voice.setLevel(logging.INFO)
        voice.propagate = False
    return voice


def counted(n: int, noun: str) -> str:
    """ "1 step", "4 steps": a count and its noun, for people (the CLI's lines and the ranks' say the same)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def say(logger: logging.Logger, rank: int, message: str, *args: object) -> None:
    """Log `message` at INFO; on rank 0, to stderr as well when logging would not show it."""
    if rank != 0 or (logger.isEnabledFor(logging.INFO) and logger.hasHandlers()):
        logger.info(message, *args)
        return
    _voice().info(message, *args)


def refuse(logger: logging.Logger, rank: int, message: str, *args: object) -> None:
    """Log `message` at ERROR where logging is configured; else rank 0 alone says it on stderr (every rank has the same
    verdict, so one paragraph is enough, and no other rank falls back to logging's bare last-resort output)."""
    if logger.isEnabledFor(logging.ERROR) and logger.hasHandlers():
        logger.error(message, *args)
    elif rank == 0:
        _voice().error(message, *args)


@contextlib.contextmanager
def refusals_said_by_caller() -> Iterator[None]:
    """Within it, `refusing` leaves a UsageError as it is, unsaid: the caller (legato's own rank entry, which says it
    once on rank 0 as `error: ...`, as for a bad config) has it to say."""
    token = _CALLER_SAYS.set(True)
    try:
        yield
    finally:
        _CALLER_SAYS.reset(token)


def refusing(entry: Entry) -> Entry:
    """`entry` (a function or a generator function of the public API), with a UsageError leaving it said and raised on
    as UsageRefused: caught like any UsageError, and, uncaught, the end of the script with exit 2 and no traceback."""
    signature = inspect.signature(entry)
    if inspect.isgeneratorfunction(entry):

        @functools.wraps(entry)
        def steps(*args, **kwargs):
            try:
                return (yield from entry(*args, **kwargs))
            except UsageError as exc:
                _refuse(exc)
            except TypeError as exc:
                _refuse(_misbound(entry, signature, args, kwargs, exc))

        return steps  # type: ignore[return-value]

    @functools.wraps(entry)
    def call(*args, **kwargs):
        try:
            return entry(*args, **kwargs)
        except UsageError as exc:
            _refuse(exc)
        except TypeError as exc:
            _refuse(_misbound(entry, signature, args, kwargs, exc))

    return call  # type: ignore[return-value]


def _misbound(entry: Callable, signature: inspect.Signature, args: tuple, kwargs: dict, exc: TypeError) -> UsageError:
    """A call's arguments that do not fit `entry` (a missing `optimizer=`, a misspelt keyword) as a UsageError naming them;
    any other TypeError (one raised inside the call) goes on as it is. Checked only once a call failed: never per step."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as unbound:
        owner, _, method = entry.__qualname__.rpartition(".")
        name = f"{owner}()" if method == "__init__" else f"{owner.lower() + '.' if owner else ''}{method}()"
        unknown = [k for k in kwargs if k not in signature.parameters]
        close = [m for k in unknown for m in difflib.get_close_matches(k, signature.parameters, n=1)]
        problem = (
            f"no argument named {', '.join(unknown)}" + (f" (did you mean {', '.join(close)}?)" if close else "")
            if unknown
            else str(unbound)
        )
        return UsageError(
            f"{name}: {problem}. Pass the arguments it takes: {name.rstrip('()')}{_shown(signature)}; the README's "
            "'Port your loop' shows a Session with each."
        )
    raise exc


def _shown(signature: inspect.Signature) -> str:
    """The signature without `self`, annotations and defaults: "(run_dir, *, model, optimizer, loader=..., ...)"."""
    parts, star = [], False
    for p in signature.parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}=...")
    return f"({', '.join(parts)})"


def _refuse(exc: UsageError) -> None:
    """Raise what leaves an entry for `exc`: itself when already said or left to the caller, else said, as UsageRefused."""
    if isinstance(exc, UsageRefused) or _CALLER_SAYS.get():
        raise exc
    raise _said(exc) from exc


def _said(exc: UsageError) -> UsageRefused:
    """Say `exc` at ERROR and return it as UsageRefused. Every rank that raised it says it (a problem may be one rank's
    own: its data, its files); on stderr, ranks other than 0 put their rank in front (the launcher's environment names
    it, also before a Session exists), and logging formats its lines as the script chose."""
    logger = logging.getLogger("legato")
    if logger.isEnabledFor(logging.ERROR) and logger.hasHandlers():
        logger.error("%s", exc)
    else:
        rank = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)
        _voice().error("%s", exc if rank == 0 else f"rank {rank}: {exc}")
    return UsageRefused(str(exc))

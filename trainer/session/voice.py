"""Rank 0's voice: the few lines a person must see reach stderr even when the script configured no logging.

A resume and its verification, and a stop, are news a person running a plain
script has to see. `say` logs them as usual when logging would show them at
INFO; otherwise, on rank 0 only, it emits them through its own stderr
handler (`legato: ...`). `refuse` does the same at ERROR for the paragraph
that ends every rank (a resume that did not verify). It must never print for
other ranks, and never show a line twice.
"""

from __future__ import annotations

import logging
import sys

_VOICE = "legato.session.voice"


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
    """"1 step", "4 steps": a count and its noun, for people (the CLI's lines and the ranks' say the same)."""
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

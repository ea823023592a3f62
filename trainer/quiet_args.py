"""argparse whose usage errors name the flag but never the value that came with it.

People mistype `--password=...` or paste a token after the wrong flag, and the
error line ends up in terminals, CI logs and tickets. argparse's own messages
quote values in a few fixed phrasings, so `Parser` cuts the value out of each
of those before argparse prints; unrecognized arguments are reported by name
only. Errors still go out as argparse prints them (usage, then one error line)
with exit code 2; a mistyped choice (a subcommand) gets the closest valid one
suggested. Both command lines use it: `legato` (legato.orchestrator) and
`python -m legato` (legato.runtime.launch). This module must never import
anything of legato's: the core and the CLI both stand on it.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import NoReturn

# argparse's phrasings that quote the value given, each with the value cut out (greedy: a value may hold anything).
_VALUE_ECHOES = (
    (re.compile(r"(invalid [\w ]+? value): .*", re.S), r"\1"),
    (re.compile(r"(invalid choice): .* (\(choose from .*\))$", re.S), r"\1 \2"),
    (re.compile(r"(invalid choice): .*", re.S), r"\1"),
    (re.compile(r"ignored explicit argument .*", re.S), "takes no value"),
    (re.compile(r"(ambiguous option: [^=\s]+)=\S*"), r"\1"),
)
_CHOICE = re.compile(r"invalid choice: '?(.*?)'? \(choose from (.*)\)$", re.S)
_FLAG = re.compile(r"--[A-Za-z][\w-]*|-[A-Za-z]")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors name the flag but never the value that came with it."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(extras))
        return parsed

    def error(self, message: str) -> NoReturn:
        super().error(without_values(message) + suggestion(message))


def without_values(message: str) -> str:
    """An argparse error message with any value it quotes cut out."""
    for pattern, replacement in _VALUE_ECHOES:
        message = pattern.sub(replacement, message)
    return message


def suggestion(message: str) -> str:
    """For an invalid choice (a mistyped subcommand, say), the valid one closest to what was typed, as "; did you mean
    'status'?": it names a choice, never the value typed; "" when none is close or the error is another."""
    found = _CHOICE.search(message)
    if found is None:
        return ""
    choices = [c.strip().strip("'") for c in found.group(2).split(",")]
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def unrecognized(extras: list[str]) -> str:
    """The error for arguments no command takes: the flags by name, anything else (values) only counted."""
    flags = [name for name in (arg.split("=", 1)[0] for arg in extras) if _FLAG.fullmatch(name)]
    values = len(extras) - len(flags)
    named = f"unrecognized arguments: {' '.join(flags)}" if flags else "unrecognized arguments"
    if values:
        named += f" (and {values} value{'s' if values > 1 else ''}, not shown)"
    return named

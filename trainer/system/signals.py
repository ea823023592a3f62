"""Signal-name parsing: the one place that turns a configured name into a signal a stop can use.

A stop signal must be one a process can catch and that the scheduler or a
person sends on purpose: `KILL` and `STOP` cannot be caught, `SIG_IGN` is not
a signal, and fault signals (`SEGV`, `BUS`, ...) or job control (`CHLD`,
`CONT`, `TSTP`) mean something else. Names are accepted with or without the
`SIG` prefix, in any case. This module must never import torch: the config
checks names with it before anything heavy loads.
"""

from __future__ import annotations

import signal

from legato.errors import UsageError

# Catchable signals that carry no other meaning for a training process.
STOP_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "XCPU", "VTALRM", "PROF")


def normalize_signal(name: object, key: str = "slurm.signal") -> str:
    """The canonical short name (`USR2`) of a usable stop signal; a UsageError naming `key` otherwise."""
    if not isinstance(name, str) or "\x00" in name:
        raise UsageError(f"{key} is {name!r}, which is not a signal name. Use one of: {', '.join(STOP_SIGNALS)}.")
    short = name.strip().upper().removeprefix("SIG")
    if short in STOP_SIGNALS and hasattr(signal, f"SIG{short}"):
        return short
    known = short in signal.Signals.__members__ or f"SIG{short}" in signal.Signals.__members__
    why = "a signal a stop cannot use (it must be catchable and mean nothing else to the process)" if known else "not a signal name"
    raise UsageError(f"{key} is {name[:40]!r}, which is {why}. Use one of: {', '.join(STOP_SIGNALS)}.")


def parse_signal(name: str) -> signal.Signals:
    """The `signal.Signals` member for a stop-signal name (`USR2`, `SIGUSR2`, `usr2`)."""
    return signal.Signals[f"SIG{normalize_signal(name)}"]

"""What a Session is told to do about checkpoints and stop signals: plain, frozen settings with their defaults.

The checkpoint settings are the config's `checkpoint:` section (legato.config), defined and documented there once, so a
Session and a `legato run` config get the same defaults (a periodic checkpoint on, a replay-verified resume). Each
setting is held, as it is made, to the bounds its config key has, so `CheckpointPolicy(keep_last=0)` is refused in one
paragraph before anything is written, as `checkpoint.keep_last: 0` is. This module must never act on a setting: the
Session and its delegates do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from legato import safeyaml
from legato.config import CheckpointSection, HangSection
from legato.config_build import check_values
from legato.errors import UsageError
from legato.system.signals import normalize_signal
from legato.voice import refusing

__all__ = ["HANG_ENV", "HASH_ENV", "CheckpointPolicy", "HangPolicy", "StopPolicy"]

HANG_ENV = "LEGATO_HANG"  # `off`, or the hang section's own keys: `floor_s=60,phase_s=600`
# N: the trajectory holds the state hash every N steps, whatever the script says (`legato verify --command` sets 1, so
# that a divergence is named at its step and component).
HASH_ENV = "LEGATO_HASH_EVERY"


def _values(section: Any) -> dict[str, Any]:
    """A section's (or policy's) fields by name, as they stand (no copies)."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


@dataclass(frozen=True)  # fields and defaults inherited; made again so that its __init__ runs the check below
class CheckpointPolicy(CheckpointSection):
    """When to checkpoint, how many to keep, and how a resume is verified: the config's `checkpoint:` section (every
    setting, its default and its bounds are defined there once), refused in one paragraph as it is made when a value
    is out of bounds."""

    @refusing
    def __post_init__(self) -> None:
        check_values(CheckpointSection, _values(self), "CheckpointPolicy")

    @classmethod
    def from_section(cls, section: CheckpointSection) -> CheckpointPolicy:
        """The policy of a config's `checkpoint:` section, as `legato run` hands it to the Session."""
        return cls(**_values(section))

    def from_env(self, environ: Mapping[str, str]) -> CheckpointPolicy:
        """This policy with `LEGATO_HASH_EVERY` applied: whoever launches the run has the last word over the script."""
        text = environ.get(HASH_ENV, "").strip()
        if not text:
            return self
        every = safeyaml.load(text, HASH_ENV)
        check_values(CheckpointSection, {"hash_every_steps": every}, HASH_ENV)
        return dataclasses.replace(self, hash_every_steps=every)


@dataclass(frozen=True)
class StopPolicy:
    """The signals that ask the run to stop at an agreed step."""

    signals: tuple[str, ...] = ("USR2",)

    @refusing
    def __post_init__(self) -> None:
        if isinstance(self.signals, str) or not isinstance(self.signals, (tuple, list)) or not self.signals:
            raise UsageError(
                f"StopPolicy: signals is {self.signals!r}, but it must be a tuple of one or more signal names. "
                'Write StopPolicy(signals=("USR2",)), or ("USR2", "TERM") for two.'
            )
        for name in self.signals:
            normalize_signal(name, key="StopPolicy: a name in signals")


@dataclass(frozen=True)  # fields and defaults inherited, as CheckpointPolicy's are
class HangPolicy(HangSection):
    """When a rank that makes no progress counts as hung: the config's `hang:` section (defined and documented there once),
    refused in one paragraph as it is made when a value is out of bounds."""

    @refusing
    def __post_init__(self) -> None:
        check_values(HangSection, _values(self), "HangPolicy")

    @classmethod
    def from_section(cls, section: HangSection) -> HangPolicy:
        """The policy of a config's `hang:` section, as `legato run` hands it to the Session."""
        return cls(**_values(section))

    def from_env(self, environ: Mapping[str, str]) -> HangPolicy:
        """This policy with `LEGATO_HANG` applied: whoever launches the run has the last word over the script."""
        text = environ.get(HANG_ENV, "").strip()
        if not text:
            return self
        if text.lower() == "off":
            return dataclasses.replace(self, watchdog=False)
        names = {f.name for f in dataclasses.fields(HangSection)}
        changes: dict[str, Any] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in names:
                raise UsageError(
                    f"{HANG_ENV}={text!r}: {item.strip()!r} is not one of the hang settings ({', '.join(sorted(names))}) as key=value. "
                    f"Write for example {HANG_ENV}=floor_s=60,phase_s=600, or {HANG_ENV}=off."
                )
            changes[key.strip()] = safeyaml.load(value.strip(), f"{HANG_ENV}: {key.strip()}")
        check_values(HangSection, changes, HANG_ENV)
        numbers = {k: float(v) for k, v in changes.items() if k != "watchdog"}
        return dataclasses.replace(self, **{**changes, **numbers})

"""The packages section of an environment capture names every installed distribution with the name and version
`importlib.metadata` reads from its whole metadata file, though the capture reads only the file's headers; a planted
version change is caught."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from legato.repro import capture
from legato.repro.redact import Redactor


def reference() -> set[str]:
    """Every distribution's `name==version`, first one of a name wins (as the capture keeps it)."""
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return set(seen.values())


LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*==\S+)(?: \(editable: .*\))?")


def listed(text: str) -> set[str]:
    """The section's `name==version` lines (an editable one without its source; its git state after them is no line)."""
    return {m.group(1) for line in text.splitlines() if (m := LINE.fullmatch(line))}


def test_every_installed_distribution_is_listed_with_its_metadata_name_and_version() -> None:
    section = capture._packages(Redactor(key=b"k" * 32), timeout=5.0)
    expected = reference()
    assert len(expected) > 20 and listed(section) == expected


def test_a_planted_version_change_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = capture._name_and_version
    monkeypatch.setattr(capture, "_name_and_version", lambda dist: (real(dist)[0], "0.0.0-planted"))
    assert listed(capture._packages(Redactor(key=b"k" * 32), timeout=5.0)) != reference()

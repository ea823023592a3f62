"""Reading a run configuration: a YAML file and `--set key=value` overrides into one raw mapping.

The file is read safely (a regular file, bounded in size, UTF-8 text, parsed by
`legato.safeyaml`); each override is a dotted key and a YAML value merged into
the mapping. What the keys mean and whether the values are right is
`legato.config`'s business. This module must NEVER interpret or validate a
key's value, open anything that is not a regular file, or write to the
filesystem.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path

from legato import safeyaml
from legato.config_build import MAX_OVERRIDE, show, show_path
from legato.errors import UsageError

OVERRIDE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def read_yaml(path: Path) -> dict:
    """The config file's mapping of sections; an empty, non-mapping or unreadable file is a `UsageError`."""
    text = _read_text(path)
    if not text.strip() or all(line.lstrip().startswith("#") for line in text.splitlines() if line.strip()):
        raise UsageError(f"{path} is empty. A config needs at least its sections; start from configs/tiny_gpt.yaml.")
    data = safeyaml.load(text, str(path))
    if data is None:
        raise UsageError(f"{path} holds an empty document. A config needs at least its sections; start from configs/tiny_gpt.yaml.")
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a mapping of sections (run:, train:, ...), not a {type(data).__name__}.")
    return data


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; never more than the size limit is read, and nothing that is not a regular file is opened."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        info = None
    if info is None:
        raise UsageError(
            f"Config file {show_path(path)} does not exist. Pass the path of a YAML config, for example configs/tiny_gpt.yaml."
        )
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} is not a regular file (a directory, device or pipe). Pass the path of a YAML config file.")
    try:
        with open(path, "rb") as f:
            data = f.read(safeyaml.MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"Config file {path} cannot be read ({exc.strerror}). Check its permissions.") from None
    if len(data) > safeyaml.MAX_BYTES:
        raise UsageError(
            f"{path} is larger than {safeyaml.MAX_BYTES // 1024} KiB, far beyond any config. Pass the config file itself, not data."
        )
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise UsageError(f"{path} is a binary or UTF-16 file. Save the config as plain UTF-8 text.")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start} is not valid). Save the config as plain UTF-8 text.") from None


def apply_override(raw: dict, item: str) -> None:
    """Merge one `--set dotted.key=value` into `raw`, the value typed as YAML types it, creating sections on the way."""
    # Messages name the key, never the value: a value may be a secret typed under a wrong or mistyped key.
    if not isinstance(item, str) or len(item) > MAX_OVERRIDE or "\x00" in item:
        key = item.partition("=")[0] if isinstance(item, str) else item
        raise UsageError(
            f"--set {show(key)}=... is longer than {MAX_OVERRIDE} characters or holds a NUL byte. Put large values in the config file."
        )
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set {show(item)} is not of the form key=value, for example --set train.steps=100.")
    parts = key.strip().split(".")
    if not all(OVERRIDE_KEY.fullmatch(part) for part in parts):
        raise UsageError(f"--set {show(key)} is not a dotted key such as train.steps. Fix the key.")
    if "\r" in text:
        # YAML would fold it into a blank without a word: a CR here is a pasted Windows line end, never meant.
        raise UsageError(f"--set {show(key)}: the value holds a carriage return (CR). Retype it on one line.")
    value = safeyaml.load(text, f"--set {show(key)}: the value")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UsageError(f"--set {show(key)}: {part} is not a section, so it has no key {parts[-1]!r}.")
        node = child
    node[parts[-1]] = value

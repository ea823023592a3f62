"""The generic typed builder: a raw mapping in, a dataclass of checked values out.

`option()` declares a field with its bounds and its one line of documentation;
`build()` walks a dataclass schema, refusing unknown keys (with the nearest
known one), wrong types and values out of bounds, each as a `UsageError` that
names the key, the problem and the fix; `check_values()` holds a keyword API's
arguments to the same fields. The ceilings every value is held to
live here, written once, and so is what a config's text and plain data may
hold (`text_problem`, `check_plain`). This module must NEVER know a key of
legato's own schema (that is `legato.config`), read a file or touch the
filesystem.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import operator
import re
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any

from legato.errors import UsageError

# Ceilings far above any real run, low enough that no count, size or time overflows or hangs what uses it.
STEPS_MAX = 10**9
KEEP_LAST_MAX = 100_000
SECONDS_MAX = 7 * 24 * 3600
MINUTES_MAX = 366 * 24 * 60
NAME_MAX = 200
MAX_TEXT = 4096
MAX_LIST = 10_000
MAX_OVERRIDE = 64 * 1024
PATH_MAX = 4096

TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a mapping"}


MAX_PLAIN_DEPTH = 32
# Control characters (C0, DEL, C1) and Unicode's line and paragraph separators: never in a name, path or one-line value.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Free text (values a task or entrypoint reads) may span lines and hold tabs, but never a CR (CRLF) or another control.
_FREE_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_NAMES = {
    "\x00": "a NUL byte",
    "\n": "a line break (LF)",
    "\r": "a carriage return (CR, as in Windows line ends)",
    "\t": "a tab",
    "\x85": "a next-line character (NEL, U+0085)",
    "\u2028": "a line separator (U+2028)",
    "\u2029": "a paragraph separator (U+2029)",
}


def option(
    default: Any,
    *,
    choices: tuple = (),
    minimum: float | None = None,
    maximum: float | None = None,
    doc: str = "",
    key: str = "",
    free_text: bool = False,
    words: tuple[str, ...] = (),
) -> Any:
    """A config field; `key` spells its YAML name where that is a Python keyword (checkpoint.async); `free_text`: the
    texts inside it (a mapping's values) may span lines; `words`: the texts a number field also takes (`auto`)."""
    meta = {"choices": choices, "minimum": minimum, "maximum": maximum, "doc": doc, "key": key, "free_text": free_text, "words": words}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def yaml_key(f: dataclasses.Field) -> str:
    """The name a field has in YAML: its `key`, else its Python name."""
    return f.metadata.get("key") or f.name


def as_dict(value: Any) -> Any:
    """A dataclass as plain data, keyed as YAML spells it; anything else deep-copied."""
    if dataclasses.is_dataclass(value):
        return {yaml_key(f): as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return copy.deepcopy(value)


def build(cls: type, raw: Any, prefix: str, source: str) -> Any:
    """An instance of the dataclass `cls` from `raw`, every key known and every value checked; `prefix` spells the section."""
    label = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"{source}: {label} must be a mapping of keys, not {show(raw)}. Write it as a YAML section.")
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in raw if k not in fields]
    if unknown:
        key = str(unknown[0])[:60]
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" Did you mean {prefix}{close[0]}?" if close else ""
        raise UsageError(
            f"{source}: {prefix}{key} is not a known key.{hint} Valid keys in {label}: {', '.join(fields)}. Fix or remove the key."
        )
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a hint is a class, never an instance
            values[f.name] = build(hint, raw[name], f"{prefix}{name}.", source)
        else:
            values[f.name] = _check_value(f"{prefix}{name}", raw[name], hint, f.metadata, source)
    return cls(**values)


def check_values(cls: type, values: dict[str, Any], source: str) -> None:
    """Keyword arguments held to the types and bounds their fields in the schema `cls` declare, keyed by the Python
    names a keyword API spells (`CheckpointPolicy(keep_last=0)`): the config's rule, written once, for both doors."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            _check_value(f.name, values[f.name], hints[f.name], f.metadata, source)


def _check_value(key: str, value: Any, hint: Any, meta: Any, source: str) -> Any:
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, str) and value in meta.get("words", ()):
        return value
    base = next(t for t in allowed if t is not type(None))
    value = _coerce(key, value, base, source, meta.get("words", ()))
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{source}: {key} is {value!r}; it must be a finite number. Write a number such as {meta.get('minimum') or 1}.")
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise UsageError(f"{source}: {key} {problem}; a setting is one line of printable text. Write it without that.")
    if isinstance(value, (dict, list)):
        check_plain(source, key, value, free=bool(meta.get("free_text")))
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        shown = ", ".join(str(c) for c in choices if c is not None)
        raise UsageError(f"{source}: {key} is {show(value)}, which is not one of: {shown}. Pick one of those.")
    minimum, maximum = meta.get("minimum"), meta.get("maximum")
    if minimum is not None and value < minimum:
        floor = "positive" if minimum == 1 else f"at least {minimum}"
        raise UsageError(f"{source}: {key} is {show(value)}, but it must be {floor}. Set a value of {minimum} or more.")
    if maximum is not None and value > maximum:
        raise UsageError(
            f"{source}: {key} is {show(value)}, beyond the largest sensible value, {maximum:g}. Set a value of at most {maximum:g}."
        )
    return value


def _coerce(key: str, value: Any, base: type, source: str, words: tuple[str, ...] = ()) -> Any:
    ok = isinstance(value, base) and not (base in (int, float) and isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise UsageError(f"{source}: {key} is {show(value)}, beyond any sensible value. Write a number of sensible size.") from None
    if base is float and isinstance(value, str):
        # PyYAML follows YAML 1.1, which reads 1e-3 (no dot) as a string.
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        also = "".join(f" or {word}" for word in words)
        raise UsageError(
            f"{source}: {key} must be {TYPE_WORDS[base]}{also}, but it is {show(value)} ({type(value).__name__}). "
            f"Write it as {TYPE_WORDS[base]}{also}, without quotes for numbers and booleans."
        )
    return value


def check_list(source: str, key: str, items: list, kind: type, low: int | None, high: int | None) -> None:
    """A list field's entries: at most MAX_LIST of them, each of `kind`, numbers within bounds."""
    if len(items) > MAX_LIST:
        raise UsageError(f"{source}: {key} holds {len(items)} entries; at most {MAX_LIST} make sense. Shorten it.")
    bad = [x for x in items if not isinstance(x, kind) or isinstance(x, bool)]
    if bad:
        raise UsageError(f"{source}: {key} must be a list of {TYPE_WORDS[kind][2:]}s, but it holds {show(bad[0])}. Fix that entry.")
    if kind is str:
        return  # their text was checked with the list (`check_plain`)
    bad = [x for x in items if (low is not None and x < low) or (high is not None and x > high)]
    if bad:
        raise UsageError(f"{source}: {key} holds {show(bad[0])}; its entries must be from {low} to {high}. Fix that entry.")


def text_problem(text: str, free: bool = False) -> str | None:
    """What makes `text` unfit as a config value ("holds a tab at character 3"), or None; never quotes the text,
    which may be a secret. `free`: line breaks and tabs are fine (text a task reads), CRs and other controls are not."""
    if len(text) > MAX_TEXT and not free:  # free text is bounded by the file's and --set's own limits
        return f"is longer than {MAX_TEXT} characters"
    found = (_FREE_CONTROL if free else _CONTROL).search(text)
    if found is None:
        return None
    char = found.group()
    return f"holds {_CONTROL_NAMES.get(char, f'the control character U+{ord(char):04X}')} at character {found.start() + 1}"


def check_plain(source: str, key: str, value: Any, free: bool = False, depth: int = 0) -> None:
    """Plain data all the way down (text keys, finite numbers, clean text, lists and mappings), or a `UsageError` naming
    the key path; for the mappings and lists legato passes on without a schema (train.options, slurm.extra_sbatch)."""
    if depth > MAX_PLAIN_DEPTH:
        raise UsageError(f"{source}: {key} nests deeper than {MAX_PLAIN_DEPTH} levels. Flatten it.")
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str) or text_problem(name):
                raise UsageError(f"{source}: {key} has a key that is not one line of printable text. Write each key as a plain word.")
            check_plain(source, f"{key}.{name}", item, free, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_plain(source, f"{key}[{index}]", item, free, depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise UsageError(
            f"{source}: {key} is {value!r}; a number in a config must be finite (nan never equals itself, so a "
            "resume would find the settings changed). Write a finite number."
        )
    elif isinstance(value, str):
        problem = text_problem(value, free)
        if problem:
            allowed = "text without CRs or other control characters" if free else "one line of printable text"
            raise UsageError(f"{source}: {key} {problem}; it must be {allowed}. Write it without that.")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise UsageError(
            f"{source}: {key} is a {type(value).__name__}; a config holds only text, numbers, true/false, null, lists "
            "and mappings. Write it as one of those."
        )


def show_path(path: Path) -> str:
    """A path as a message may quote it: control characters escaped, at most 300 characters."""
    text = str(path)
    if any(ord(c) < 32 for c in text):
        text = repr(text)
    return text if len(text) <= 300 else text[:297] + "..."


def whole_number(value: Any) -> int | None:
    """`value` as an int when a keyword API may take it as a count or seed (an int or a numpy integer, never a bool or
    a float that happens to be whole), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def show(value: Any, limit: int = 60) -> str:
    """A value as a message may quote it: short, one line, never a huge number spelled out."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

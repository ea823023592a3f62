"""YAML for configs, read with limits: no document can hang, exhaust memory or crash the reader.

Limits apply before anything is built: the text's size, the nesting depth,
the number of nodes *after* alias expansion (a "billion laughs" document is
small on disk and astronomically large expanded), duplicate keys (YAML would
silently keep the last one), and integers too long to print. Every violation
is a `UsageError` naming where it is and what to do. Values are limited to
YAML's core schema (text, numbers, true/false, null, lists and mappings with
text keys): dates, `!!binary`, `!!set`, `!!omap`, `!!pairs`, `!!python/...`
and every other tag are refused by name, since they reach the config as types
nothing downstream can compare, sort or write (a date against a string, bytes
in JSON). Only PyYAML's safe constructors are used, so no tag can build a
Python object. This module must never read files: callers hand it text.
"""

from __future__ import annotations

from typing import Any, Protocol

import yaml

from legato.errors import UsageError

MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_INT_DIGITS = 100

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Line(Protocol):
    line: int  # 0-based, in PyYAML's Python and C marks alike


class _Refused(Exception):
    """A value the config cannot hold, raised while constructing and turned into a `UsageError` that names where."""

    def __init__(self, what: str, fix: str, mark: yaml.Mark | None) -> None:
        super().__init__(what)
        self.what, self.fix, self.mark = what, fix, mark


_CORE = "tag:yaml.org,2002:"
_PLAIN = "configs hold only text, numbers, true/false, null, lists and mappings"
# tag -> (what it is, the fix); a tag not named here is refused as "the tag ..." with REMOVE_TAG.
_REFUSED_TAGS = {
    _CORE + "timestamp": (
        "a date or time (!!timestamp; YAML reads an unquoted 2024-01-01 as one)",
        'Quote it ("2024-01-01") to make it text.',
    ),
    _CORE + "binary": ("binary data (!!binary)", "Write it as text."),
    _CORE + "set": ("a set (!!set)", "Write a list instead."),
    _CORE + "omap": ("an ordered map (!!omap)", "Write a mapping instead."),
    _CORE + "pairs": ("a list of pairs (!!pairs)", "Write a mapping instead."),
}
REMOVE_TAG = "Remove the tag."
_KEY_TYPES = {bool: "true/false", int: "an integer", float: "a number", type(None): "null"}


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_CORE) :] if tag.startswith(_CORE) else tag


class _Loader(_Base):  # type: ignore[misc,valid-type]
    """SafeLoader limited to the core schema: text keys only, no key twice in one mapping (merge keys `<<` excepted)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key is a list or mapping, which YAML mappings here cannot hold", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                # Keys are never quoted in messages: a token pasted as a key is still a token.
                raise _Refused(
                    f"a mapping key that is {_KEY_TYPES.get(type(key), type(key).__name__)}, not text",
                    "Quote the key to make it text.",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key[:60]!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def refuse_tag(self, node: yaml.Node) -> Any:
        """The constructor of every tag beyond the core schema: a `_Refused` naming the tag."""
        what, fix = _REFUSED_TAGS.get(node.tag, (f"the tag {_tag_name(node.tag)[:80]}", REMOVE_TAG))
        raise _Refused(what, fix, node.start_mark)


for _tag in _REFUSED_TAGS:
    _Loader.add_constructor(_tag, _Loader.refuse_tag)
_Loader.add_constructor(None, _Loader.refuse_tag)
# YAML 1.1 resolves a lone "=" to its "value" type, which has no constructor: it is the text "=".
_Loader.add_constructor(_CORE + "value", _Loader.construct_yaml_str)


def load(text: str, where: str) -> Any:
    """The document in `text`, checked against every limit; `where` names it in messages."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise UsageError(f"{where} is larger than {MAX_BYTES // 1024} KiB, far beyond any config. Pass the config file itself, not data.")
    _check_shape(text, where)
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        at = f" at line {exc.mark.line + 1}, column {exc.mark.column + 1}" if exc.mark else ""
        raise UsageError(f"{where} holds {exc.what}{at}; {_PLAIN}. {exc.fix}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(exc.problem or exc.context).split())
        raise UsageError(
            f"{where} is not valid YAML{at}: {what}. Fix it there (indentation, a missing colon or quote, a repeated key)."
        ) from None
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        raise UsageError(f"{where} is not valid YAML: {' '.join(str(exc).split())[:200]}. Fix the syntax.") from None
    finally:
        loader.dispose()


def _check_shape(text: str, where: str) -> None:
    """Walk the event stream (iteratively, so deep nesting cannot overflow the stack) and measure the expanded size."""
    depth = 0
    sizes: list[int] = [0]  # node count of each open collection, innermost last
    anchors: list[str | None] = [None]
    anchored: dict[str | None, int] = {}  # (an alias's anchor is typed optional)
    try:
        for event in yaml.parse(text, Loader=_Base):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(where, event.start_mark)
                sizes.append(1)
                anchors.append(event.anchor)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                size, anchor = sizes.pop(), anchors.pop()
                if anchor:
                    anchored[anchor] = size
                sizes[-1] += size
            elif isinstance(event, yaml.ScalarEvent):
                _check_scalar(event, where)
                sizes[-1] += 1
                if event.anchor:
                    anchored[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                sizes[-1] += anchored.get(event.anchor, 1)
            if sum(sizes) > MAX_NODES:
                raise UsageError(
                    f'{where} expands to more than {MAX_NODES} values (aliases that repeat aliases, a "billion laughs"). '
                    "Write the values out, or use fewer nested aliases."
                )
    except yaml.MarkedYAMLError as exc:
        # PyYAML 6.0.4 refuses deep nesting itself, in its scanner, ahead of the events counted above.
        if "nesting depth" in str(exc.problem):
            raise _too_deep(where, exc.problem_mark) from None
        return  # the loader reports syntax errors with their position
    except yaml.YAMLError:
        return


def _too_deep(where: str, mark: _Line | None) -> UsageError:
    line = mark.line + 1 if mark else "?"
    return UsageError(f"{where} nests deeper than {MAX_DEPTH} levels (at line {line}). A config needs a few levels; flatten it.")


def _check_scalar(event: yaml.ScalarEvent, where: str) -> None:
    value = event.value
    if not event.style and len(value) > MAX_INT_DIGITS and value.lstrip("+-").replace("_", "").isdigit():
        line = event.start_mark.line + 1 if event.start_mark else "?"
        raise UsageError(f"{where} holds a {len(value)}-digit number at line {line}; no setting takes one. Write a sensible value.")

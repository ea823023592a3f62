"""YAML for configs, read with limits: no document can hang, exhaust memory or crash the reader.

Limits apply before anything is built: the text's size, the nesting depth,
the number of nodes *after* alias expansion (a "billion laughs" document is
small on disk and astronomically large expanded), duplicate keys (YAML would
silently keep the last one), and integers too long to print. Every violation
is a `UsageError` naming where it is and what to do. Only PyYAML's safe
constructors are used, so no tag can build a Python object. This module must
never read files: callers hand it text.
"""

from __future__ import annotations

from typing import Any

import yaml

from legato.errors import UsageError

MAX_BYTES = 256 * 1024
MAX_DEPTH = 32
MAX_NODES = 100_000
MAX_INT_DIGITS = 100

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc,valid-type]
    """SafeLoader that refuses a key written twice in one mapping (merge keys `<<` excepted)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, "a key is a list or mapping, which YAML mappings here cannot hold",
                                                        key_node.start_mark) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"the key {str(key)[:60]!r} appears twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(text: str, where: str) -> Any:
    """The document in `text`, checked against every limit; `where` names it in messages."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise UsageError(f"{where} is larger than {MAX_BYTES // 1024} KiB, far beyond any config. Pass the config file itself, not data.")
    _check_shape(text, where)
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(exc.problem or exc.context).split())
        raise UsageError(
            f"{where} is not valid YAML{at}: {what}. Fix it there (indentation, a missing colon or quote, a repeated key)."
        ) from None
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        raise UsageError(f"{where} is not valid YAML: {' '.join(str(exc).split())[:200]}. Fix the syntax.") from None


def _check_shape(text: str, where: str) -> None:
    """Walk the event stream (iteratively, so deep nesting cannot overflow the stack) and measure the expanded size."""
    depth = 0
    sizes: list[int] = [0]  # node count of each open collection, innermost last
    anchors: list[str | None] = [None]
    anchored: dict[str, int] = {}
    try:
        for event in yaml.parse(text, Loader=_Base):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    raise UsageError(f"{where} nests deeper than {MAX_DEPTH} levels (at line {line}). A config needs a few levels; "
                                     "flatten it.")
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
                    f"{where} expands to more than {MAX_NODES} values (aliases that repeat aliases, a \"billion laughs\"). "
                    "Write the values out, or use fewer nested aliases."
                )
    except yaml.MarkedYAMLError:
        return  # the loader reports syntax errors with their position
    except yaml.YAMLError:
        return


def _check_scalar(event: yaml.ScalarEvent, where: str) -> None:
    value = event.value
    if not event.style and len(value) > MAX_INT_DIGITS and value.lstrip("+-").replace("_", "").isdigit():
        line = event.start_mark.line + 1 if event.start_mark else "?"
        raise UsageError(f"{where} holds a {len(value)}-digit number at line {line}; no setting takes one. Write a sensible value.")

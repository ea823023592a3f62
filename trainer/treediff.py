"""The one recursive diff of nested plain data (configs, manifests' training settings, redacted trees).

Pure function of its inputs; never mutates them.
"""

from __future__ import annotations

from typing import Any


def changed_leaves(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where two nested dicts/lists differ, as (dotted key, old, new), in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += changed_leaves(old.get(key), new.get(key), f"{prefix}{key}.")
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [leaf for i, (a, b) in enumerate(zip(old, new)) for leaf in changed_leaves(a, b, f"{prefix}{i}.")]
    return [] if old == new else [(prefix.rstrip("."), old, new)]

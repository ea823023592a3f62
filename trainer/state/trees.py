"""Walks over the nested containers a state dict is made of: mappings, lists and tuples, with anything else a leaf.

Two walks serve every module that rewrites or reads a saved tree: `rebuilt` (a new tree, some nodes replaced, each
with its dotted path for messages) and `leaves` (everything that is not a container, in order). Every `Mapping`
comes back as a plain `dict`, a list as a list, any tuple as a plain tuple: what `torch.load(weights_only=True)` can
hold. This module must never change a tree in place, never look inside a leaf, and never import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

DESCEND = object()
"""What a `rebuilt` replacer returns for a node it leaves to the walk: a container is walked into, a leaf kept."""


def rebuilt(tree: Any, replace: Callable[[Any, str | None], Any], where: str | None = None) -> Any:
    """`tree` copied, with every node for which `replace(node, path)` returns something other than `DESCEND`
    replaced by that. `replace` sees each container before its contents, so a marker shaped like a dict or a tuple
    can be replaced whole. `path` names the node (`model.layer.weight`, `state[0]`) from `where`; without `where`
    it is None and no path is built (the walks on the training path name nothing)."""
    out = replace(tree, where)
    if out is not DESCEND:
        return out
    if isinstance(tree, Mapping):
        return {k: rebuilt(v, replace, _key_path(where, k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [rebuilt(v, replace, None if where is None else f"{where}[{i}]") for i, v in enumerate(tree)]
        return items if isinstance(tree, list) else tuple(items)
    return tree


def _key_path(where: str | None, key: Any) -> str | None:
    if where is None:
        return None
    return f"{where}.{key}" if where else str(key)


def leaves(tree: Any) -> Iterator[Any]:
    """Every node of `tree` that is not a mapping, list or tuple, depth first in the containers' own order."""
    if isinstance(tree, Mapping):
        for value in tree.values():
            yield from leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from leaves(value)
    else:
        yield tree

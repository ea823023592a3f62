"""The two walks over saved trees (legato.state.trees): what they keep, what they replace, the paths they name.

Pure functions in one process; the walks at work are in test_spread_layout.py (shares and their markers),
test_reshard_units.py and the FSDP2 runs (DTensor records).
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legato.state.trees import DESCEND, leaves, rebuilt

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=30,
)
# No deadline or speed check: on a loaded CI machine a slow example is not a failure; fixed examples, no database.
STEADY = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


@STEADY
@given(plain)
def test_a_walk_that_replaces_nothing_gives_back_an_equal_tree_of_the_same_container_types(tree) -> None:
    copy = rebuilt(tree, lambda node, path: DESCEND)
    assert copy == tree
    assert _shape(copy) == _shape(tree)


@STEADY
@given(plain)
def test_leaves_are_every_non_container_in_order(tree) -> None:
    assert list(leaves(tree)) == list(_leaves(tree))


def test_a_marker_shaped_like_a_container_is_replaced_whole_and_named_by_its_path() -> None:
    tree = {"state": {0: {"exp_avg": ("marker", 1, 7), "step": 3}}, "groups": [{"lr": 0.1}, ("marker", 0, 2)]}
    seen = {}

    def replace(node, path):
        if isinstance(node, tuple) and node[:1] == ("marker",):
            seen[path] = node
            return f"tensor {node[1]}.{node[2]}"
        return DESCEND

    out = rebuilt(tree, replace, "")
    assert out == {"state": {0: {"exp_avg": "tensor 1.7", "step": 3}}, "groups": [{"lr": 0.1}, "tensor 0.2"]}
    assert seen == {"state.0.exp_avg": ("marker", 1, 7), "groups[1]": ("marker", 0, 2)}
    assert tree["state"][0]["exp_avg"] == ("marker", 1, 7), "the tree walked is left as it was"


def test_any_mapping_comes_back_a_plain_dict_and_paths_start_from_the_root_given() -> None:
    out = rebuilt(OrderedDict(a=[1, (2, 3)]), lambda node, path: DESCEND)
    assert type(out) is dict and out == {"a": [1, (2, 3)]}
    paths = []
    rebuilt({"w": [5]}, lambda node, path: paths.append(path) or DESCEND, "model")
    assert paths == ["model", "model.w", "model.w[0]"]
    unnamed = []
    rebuilt({"w": [5]}, lambda node, path: unnamed.append(path) or DESCEND)
    assert unnamed == [None, None, None], "without a root path none is built"


@pytest.mark.parametrize("planted", ["list as tuple", "dropped leaf"])
def test_the_shape_check_catches_a_planted_difference(planted: str) -> None:
    tree = {"a": [1, 2]}
    other = {"a": (1, 2)} if planted == "list as tuple" else {"a": [1]}
    assert _shape(other) != _shape(tree)


def _shape(tree):
    """The tree's containers by type, with each leaf's type: what an equality of values would not see."""
    if isinstance(tree, dict):
        return ("dict", tuple((k, _shape(v)) for k, v in tree.items()))
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, tuple(_shape(v) for v in tree))
    return type(tree).__name__


def _leaves(tree):
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [leaf for v in tree for leaf in _leaves(v)]
    return [tree]

"""Plain Python state: the objects a loop changes through their plain attributes, found, and registered without a class.

A training loop keeps state that is neither a tensor nor a torch object: an
average meter's sum and count, a best-checkpoint saver's list of (metric,
path) and its best epoch, a counter on a trainer object. None of it has a
`state_dict`, so no census by kind sees it, and a resume rebuilds it empty
while the trajectory verifies: a run that ships another "best" model, or a
scheduler fed another loss average.

- `fingerprints` looks at the user's variables (the same roots as the census,
  legato.state.census.user_variables) and, a few levels deep, at every object
  of a class that is not torch's, numpy's, the standard library's, legato's or
  a known display package's (a progress bar's counters are no training
  state): the digest of its plain attributes (numbers, strings, booleans,
  None, and lists, tuples and dicts of them), keyed by where it was found.
- `changed` compares two such looks: an object found at the same place with
  other plain attributes is state that training changes and legato does not
  save (a `Finding` of kind PLAIN), unless a registered component covers it.
- `attributes(obj, *names)` registers such an object without a wrapper class
  of the user's: a `Stateful` of its named (or all its plain) attributes,
  saved as plain data (torch.load(weights_only=True) reads it; nothing is
  pickled).

This module must never change what it looks at, call a method of a user's
object, draw from an RNG or keep a reference to what it found.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
import types
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from legato.errors import UsageError
from legato.state.census import MAX_DEPTH, MAX_ITEMS, MAX_NODES, PLAIN, Covered, Finding, key_label, user_variables

# Display and logging packages whose objects count steps or times for people, never for training.
DISPLAY_PACKAGES = frozenset({"tqdm", "rich", "wandb", "tensorboard", "tensorboardX", "mlflow", "neptune", "aim", "comet_ml"})
_NOT_STATE_PACKAGES = frozenset({"torch", "numpy", "legato", "builtins"})
_STDLIB = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
MAX_PLAIN_ITEMS = 200  # items of a list or dict attribute looked at (a longer one counts by its length and first items)


@dataclass(frozen=True)
class Print:
    """One object's plain attributes as a digest, with its class and how many attributes went in."""

    type: str
    digest: str
    attributes: int


def fingerprints(registered: Iterable[Any], frame: types.FrameType | None) -> dict[str, Print]:
    """Where -> Print of every uncovered object with plain attributes reachable from the user's variables above `frame`."""
    covered = Covered(registered)
    found: dict[str, Print] = {}
    visited: set[int] = set()
    queue = deque((name, context, value, 0) for name, context, value in user_variables(frame or sys._getframe(1)))
    while queue and len(visited) < MAX_NODES:
        path, context, obj, depth = queue.popleft()
        if id(obj) in visited or obj in covered or _is_plain(obj, 0) or isinstance(obj, (type, types.ModuleType)):
            continue
        visited.add(id(obj))
        if isinstance(obj, (dict, list, tuple, set, frozenset, deque)):
            children: Iterable[tuple[Any, Any]] = (dict(obj) if isinstance(obj, dict) else dict(enumerate(obj))).items()
            if depth < MAX_DEPTH:
                queue.extend((path + key_label(k, i), context, v, depth + 1) for i, (k, v) in enumerate(list(children)[:MAX_ITEMS]))
            continue
        attrs = getattr(obj, "__dict__", None)
        cls: type = type(obj)  # declared: mypy matches a bare class object against Hashable as if its __hash__ were unbound
        if not isinstance(attrs, dict) or not _may_hold_training_state(cls):
            continue
        plain = {k: v for k, v in list(attrs.items())[:MAX_ITEMS] if isinstance(k, str) and _is_plain(v, 0)}
        if plain:
            found[f"{path} ({context})"] = Print(_type_name(obj), _digest(plain), len(plain))
        if depth < MAX_DEPTH:
            queue.extend((f"{path}.{k}", context, v, depth + 1) for k, v in list(attrs.items())[:MAX_ITEMS] if k not in plain)
    return found


def changed(before: dict[str, Print], after: dict[str, Print]) -> list[Finding]:
    """The objects found at the same place in both looks, of the same class, whose plain attributes differ."""
    return [
        Finding(PLAIN, now.type, where, f"{now.attributes} plain attribute(s)")
        for where, now in after.items()
        if where in before and before[where].type == now.type and before[where].digest != now.digest
    ]


def short_name(where: str) -> str:
    """The variable path of a finding's place, without its context: "saver.checkpoint_files", "losses_m"."""
    return where.split(" (", 1)[0]


class Attributes:
    """Named attributes of a user's object (all its plain ones when none are named) as a `Stateful` of plain data."""

    def __init__(self, obj: Any, names: tuple[str, ...]) -> None:
        if not isinstance(getattr(obj, "__dict__", None), dict):
            raise UsageError(
                f"legato.attributes() takes an object with attributes; got a {type(obj).__name__}. Pass the object "
                "whose attributes change during training (a meter, a saver, a trainer), e.g. legato.attributes(meter)."
            )
        missing = [n for n in names if n not in vars(obj)]
        if missing:
            raise UsageError(
                f"legato.attributes(): the {type(obj).__name__} has no attribute {', '.join(missing)}. Name attributes "
                f"it has ({', '.join(sorted(vars(obj))[:8])}), or none to save all its plain ones."
            )
        self.obj, self.names = obj, names

    def state_dict(self) -> dict:
        names = self.names or tuple(k for k, v in vars(self.obj).items() if _is_plain(v, 0))
        state = {name: getattr(self.obj, name) for name in names}
        unsaveable = [name for name, value in state.items() if not _is_plain(value, 0)]
        if unsaveable:
            raise UsageError(
                f"legato.attributes() saves plain data only (numbers, strings, booleans, None, and lists, tuples and dicts of them); "
                f"the {type(self.obj).__name__}'s {', '.join(unsaveable)} holds a {type(state[unsaveable[0]]).__name__}. Register that "
                "value another way (a tensor or an object with state_dict/load_state_dict in extras), or leave it out of the names."
            )
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self.obj, name, value)


def attributes(obj: Any, *names: str) -> Attributes:
    """Make `obj`'s named attributes (all its plain ones when none are named) a Stateful, for `Session(extras={...})`:
    `extras={"losses": legato.attributes(losses_m), "saver": legato.attributes(saver, "checkpoint_files", "best_epoch")}`."""
    return Attributes(obj, names)


def _is_plain(value: Any, depth: int) -> bool:
    """Numbers, strings, booleans, None, and (two levels of) lists, tuples and dicts of them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if depth >= 2 or not isinstance(value, (list, tuple, dict)):
        return False
    items = list(value.items())[:MAX_PLAIN_ITEMS] if isinstance(value, dict) else list(value)[:MAX_PLAIN_ITEMS]
    if isinstance(value, dict):
        return all(_is_plain(k, 2) and _is_plain(v, depth + 1) for k, v in items)
    return all(_is_plain(v, depth + 1) for v in items)


def _digest(plain: dict[str, Any]) -> str:
    # repr of a float is its shortest round-tripping form: two floats with the same repr have the same bits.
    return hashlib.blake2b(repr(sorted(plain.items())).encode(), digest_size=16).hexdigest()


@lru_cache(maxsize=4096)
def _may_hold_training_state(cls: type) -> bool:
    """A class of the user's or of a training library (timm's meters and savers), not torch's, numpy's, the standard
    library's, legato's, or a display package's."""
    module = getattr(cls, "__module__", "") or ""
    top = module.split(".")[0]
    if top in _NOT_STATE_PACKAGES or top in DISPLAY_PACKAGES:
        return False
    path = getattr(sys.modules.get(module), "__file__", None)
    if path is None:
        return module == "__main__"
    return not (path.startswith(_STDLIB) and "-packages" not in path)


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"

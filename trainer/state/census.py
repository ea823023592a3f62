"""A census of state legato does not save: the stateful objects of the process that no registered component covers.

An EMA model, a second optimizer, a scheduler, a GradScaler or a generator the
user forgot to register resumes silently wrong: the resume's hash and replay
see only registered state. `find_unsaved` looks for such objects two ways:

- it walks the user's own variables: the locals and globals of every frame on
  the stack that is not the standard library's, an installed package's or
  legato's, and `__main__`'s globals, into plain containers and the user's own
  objects (a `Trainer`'s attributes) a few levels deep. This names where each
  object lives and is the only way to see `torch.Generator`s (invisible to the
  garbage collector) and objects that merely have `state_dict`;
- it sweeps the garbage collector's objects for the heavy kinds (modules with
  parameters or buffers, optimizers, LR schedulers, enabled GradScalers),
  which finds them wherever they are held. A candidate only the sweep saw is
  kept only if it survives a collection (no false alarm from garbage).

An object is covered when it is reachable from a registered one (the model's
parameters and buffers, the optimizer, the loader's sampler and generators,
the extras, the objects passed as ignored) or is one of the RNGs legato saves
itself (torch's default generators, `random`'s global instance). A module is
covered when every parameter and buffer it has is. Only the outermost of
nested findings is named (an `AveragedModel`, not the copy inside it).

The walk also names a DataLoader other than the Session's with persistent
workers and no generator of its own (a validation loader): not unsaved state,
but a hidden draw. It takes its workers' base seed from the global torch RNG
at its first iteration only, so a resumed process draws once more than the
uninterrupted run and the training's random numbers go on differently.

This module must never call `state_dict()` on what it finds (some take a
collective), never draw from an RNG, never touch the disk or the process group,
and never keep a reference to what it found.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import sysconfig
import types
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

MODULE, OPTIMIZER, SCHEDULER, SCALER = "module", "optimizer", "LR scheduler", "GradScaler"
TORCH_GENERATOR, NUMPY_GENERATOR, PYTHON_RANDOM, STATEFUL = "torch.Generator", "numpy Generator", "random.Random", "object with state_dict"
LOADER = "DataLoader with persistent workers"  # only one that draws its workers' seed from the global RNG
PLAIN = "plain object the loop changes"  # found by legato.state.plain: its plain attributes changed between two looks
SWEPT = (MODULE, OPTIMIZER, SCHEDULER, SCALER)  # the kinds the garbage-collector sweep looks for; RNGs only as user variables
MAX_DEPTH = 3  # a root (a variable) is depth 0: trainer.ema.module is as deep as the walk goes
MAX_NODES = 50_000  # bounds the walk's cost in a process holding big containers
MAX_ITEMS = 1_000  # items looked at per container
_LIBRARY_PATHS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


@dataclass(frozen=True)
class Finding:
    """One object legato does not save: its kind, class, where it was found and how big its state is (plain strings)."""

    kind: str
    type: str
    where: str
    size: str

    def as_dict(self) -> dict[str, str]:
        """The finding as a plain dict (for events and the exchange between ranks)."""
        return asdict(self)


class Covered:
    """The objects and tensors the registered components (and the ignored objects) already account for."""

    def __init__(self, registered: Iterable[Any]) -> None:
        self.objects: set[int] = set()
        self.tensors: set[int] = set()
        self._keep: list[Any] = []  # ids are only meaningful while their objects live
        self._cover([*registered, *_saved_by_legato()])

    def __contains__(self, obj: Any) -> bool:
        return id(obj) in self.objects

    def uncovered_tensors(self, module: torch.nn.Module) -> list[torch.Tensor]:
        """The parameters and buffers of `module` that no registered component holds."""
        seen: set[int] = set()
        out = []
        for t in (*module.parameters(), *module.buffers()):
            if id(t) not in self.tensors and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def _cover(self, roots: list[Any]) -> None:
        queue = deque((r, 0) for r in roots if r is not None)
        while queue:
            obj, depth = queue.popleft()
            if id(obj) in self.objects or isinstance(obj, (str, bytes, int, float, type, types.ModuleType)):
                continue
            self.objects.add(id(obj))
            self._keep.append(obj)
            if isinstance(obj, torch.Tensor):
                self.tensors.add(id(obj))
                if obj.grad is not None:
                    self.tensors.add(id(obj.grad))
                continue
            if isinstance(obj, torch.nn.Module):
                queue.extend((t, depth) for t in (*obj.parameters(), *obj.buffers()))
                queue.extend((m, depth) for m in obj.modules() if m is not obj)
            if depth < MAX_DEPTH:
                queue.extend((child, depth + 1) for _, child in _children(obj, registered=True))


def find_unsaved(registered: Iterable[Any], frame: types.FrameType | None = None) -> list[Finding]:
    """The stateful objects no registered component covers, outermost first; `frame`: where the user's stack starts."""
    covered = Covered(registered)
    found: dict[int, tuple[Any, str, str]] = {}  # id -> (object, kind, where)
    for where, obj, kind in _walk(user_variables(frame or sys._getframe(1)), covered):
        found.setdefault(id(obj), (obj, kind, where))
    for obj, kind in _confirmed(_sweep(covered, set(found) | _inner(found))):
        found[id(obj)] = (obj, kind, _holder(obj))
    inner = _inner(found)
    findings = [
        Finding(kind, _type_name(obj), where, _size(obj, kind, covered)) for key, (obj, kind, where) in found.items() if key not in inner
    ]
    return sorted(findings, key=lambda f: (SWEPT.index(f.kind) if f.kind in SWEPT else len(SWEPT), f.where))


def _inner(found: dict[int, tuple[Any, str, str]]) -> set[int]:
    """The ids of the submodules of found modules: named through their outermost module only."""
    return {id(m) for obj, kind, _ in found.values() if kind == MODULE for m in obj.modules() if m is not obj}


def describe(findings: list[Finding]) -> str:
    """One paragraph for people: what was found, and how to register it, change it or mark it ignored."""
    state = [f for f in findings if f.kind != LOADER]
    loaders = [f for f in findings if f.kind == LOADER]
    parts = []
    if state:
        parts.append(
            f"legato does not save {len(state)} stateful object(s) of this process: {_items(state)}. A resumed run restores "
            "only registered state, so these would silently restart from whatever the script rebuilds while the resume "
            "reports itself verified. Register each one that changes during training, e.g. Session(..., extras={'ema': ema}) "
            "(any object with state_dict()/load_state_dict(), a torch/numpy Generator or a random.Random)."
        )
    if loaders:
        parts.append(
            f"{len(loaders)} DataLoader(s) besides the Session's have persistent workers and no generator= of their own: "
            f"{_items(loaders)}. Such a loader draws its workers' base seed from the global torch RNG at its first iteration "
            "only; a resumed process iterates it for the first time again, one draw more than the uninterrupted run, so the "
            "training's random numbers (dropout, augmentation) go on differently while the resume reports itself verified. "
            "Give it generator=torch.Generator() or persistent_workers=False (a training loader: pass it as loader=)."
        )
    if any(f.kind == PLAIN for f in state):
        parts.append(
            "An object whose plain attributes change (a meter, a best-checkpoint saver's list, a counter) registers without "
            "a class of your own: extras={'saver': legato.attributes(saver)} saves its plain attributes."
        )
    parts.append("Mark an object that needs none of this with Session(..., ignore=[obj]) or session.ignore(obj) before the loop.")
    return " ".join(parts)


def _items(findings: list[Finding]) -> str:
    return "; ".join(f"{f.type} ({f.kind}, {f.size}) found as {f.where}" for f in findings)


# -- what is an object --------------------------------------------------------


def kind_of(obj: Any) -> str | None:
    """The kind of stateful object `obj` is, or None (a GradScaler counts only when enabled; a module only with tensors)."""
    if isinstance(obj, (type, types.ModuleType, torch.Tensor)):
        return None
    kind = _hashable_kind(type(obj))
    if kind == LOADER:
        if obj.persistent_workers and obj.num_workers > 0 and obj.generator is None:
            return LOADER
        kind = None  # any other loader is no finding, unless it has a state_dict (torchdata's StatefulDataLoader)
    if kind == SCALER and not obj.is_enabled():
        return None
    if kind == MODULE and next(iter((*obj.parameters(), *obj.buffers())), None) is None:
        return None
    # Looked up on the class: an instance's __getattr__ may have side effects (lazy loading, deprecation warnings).
    if kind is None and callable(getattr(type(obj), "state_dict", None)) and callable(getattr(type(obj), "load_state_dict", None)):
        return STATEFUL
    return kind


@lru_cache(maxsize=4096)
def _kind_of_type(cls: type) -> str | None:
    kinds = (
        (torch.nn.Module, MODULE),
        (torch.optim.Optimizer, OPTIMIZER),
        ((torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau), SCHEDULER),
        (torch.amp.GradScaler, SCALER),
        (torch.Generator, TORCH_GENERATOR),
        (np.random.Generator, NUMPY_GENERATOR),
        (random.Random, PYTHON_RANDOM),
        (torch.utils.data.DataLoader, LOADER),
    )
    return next((kind for base, kind in kinds if issubclass(cls, base)), None)


@lru_cache(maxsize=4096)
def _is_library(module_name: str) -> bool:
    """Whether a module is the standard library's, an installed package's or legato's: not the user's own code."""
    if module_name.split(".")[0] in ("legato", "builtins", "torch", "numpy"):
        return True
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if path is None:
        return module_name != "__main__"  # builtins and frozen modules; a `python -c` main is the user's
    return path.startswith(_LIBRARY_PATHS)


def _is_users(obj: Any) -> bool:
    """An instance of a class from the user's own code (its attributes are walked), or a plain namespace."""
    return isinstance(obj, (types.SimpleNamespace, argparse.Namespace)) or not _is_library(_type_module(obj))


def key_label(key: Any, position: int) -> str:
    """A dict key as a path shows it: a literal by its repr, anything else by its type and position. Never a tensor's
    repr (an optimizer's state is keyed by parameters): formatting the values is slow, and they change between looks."""
    if key is None or isinstance(key, (str, int, float, bytes)):
        return f"[{key!r}]"
    return f"[<{type(key).__name__} #{position}>]"


def _children(obj: Any, registered: bool = False) -> Iterator[tuple[str, Any]]:
    """(label, value) of what a container or an object holds; registered objects are opened whatever their class."""
    if isinstance(obj, dict):
        items: Iterable = ((key_label(k, i), v) for i, (k, v) in enumerate(obj.items()))
    elif isinstance(obj, (list, tuple, set, frozenset, deque)):
        items = ((f"[{i}]", v) for i, v in enumerate(obj))
    elif isinstance(obj, (torch.Tensor, types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return
    elif registered or _is_users(obj):
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return
        items = ((f".{k}", v) for k, v in attrs.items())
    else:
        return
    for i, item in enumerate(items):
        if i == MAX_ITEMS:
            return
        yield item


# -- the walk of the user's variables -------------------------------------------


def user_variables(frame: types.FrameType | None) -> Iterator[tuple[str, str, Any]]:
    """(name, context, value) of every variable of the user's frames, and of `__main__`'s globals."""
    seen_globals: set[int] = set()
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not _is_library(name):
            code = frame.f_code
            context = f"local of {code.co_name}() in {code.co_filename}:{code.co_firstlineno}"
            yield from ((var, context, value) for var, value in list(frame.f_locals.items()))
            if id(frame.f_globals) not in seen_globals:
                seen_globals.add(id(frame.f_globals))
                yield from ((var, f"global of module {name}", value) for var, value in _module_variables(frame.f_globals))
        frame = frame.f_back
    main = sys.modules.get("__main__")
    if main is not None and id(vars(main)) not in seen_globals:
        yield from ((var, "global of module __main__", value) for var, value in _module_variables(vars(main)))


def _module_variables(namespace: dict[str, Any]) -> list[tuple[str, Any]]:
    """A module's own variables: not the interpreter's `__dunder__` entries (`__loader__` is the import system's, and
    a test runner's import hook changes with every import a loop makes; none of them is training state)."""
    return [(var, value) for var, value in list(namespace.items()) if not (var.startswith("__") and var.endswith("__"))]


def _walk(roots: Iterator[tuple[str, str, Any]], covered: Covered) -> Iterator[tuple[str, Any, str]]:
    """(where, object, kind) of each uncovered stateful object reachable from `roots` within MAX_DEPTH."""
    visited: set[int] = set()
    queue = deque((name, context, value, 0) for name, context, value in roots)
    while queue and len(visited) < MAX_NODES:
        path, context, obj, depth = queue.popleft()
        if id(obj) in visited or obj in covered or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        visited.add(id(obj))
        if _type_module(obj).startswith("legato"):
            continue
        kind = kind_of(obj)
        if kind is not None:
            if kind != MODULE or covered.uncovered_tensors(obj):
                yield f"{path} ({context})", obj, kind
            continue
        if depth < MAX_DEPTH:
            queue.extend((path + label, context, child, depth + 1) for label, child in _children(obj))


def _type_module(obj: Any) -> str:
    return getattr(type(obj), "__module__", "") or ""


# -- the garbage-collector sweep --------------------------------------------------


def _sweep(covered: Covered, named: set[int]) -> list[tuple[weakref.ref, str]]:
    """(weak reference, kind) of each uncovered heavy stateful object the walk did not name.

    Weak, so that garbage stays collectable (every swept kind derives from a torch class that allows weak references).
    """
    out: list[tuple[weakref.ref, str]] = []
    for obj in _swept_objects():
        cls: type = type(obj)  # declared: mypy matches a bare class object against Hashable as if its __hash__ were unbound
        kind = _kind_of_type(cls)
        assert kind is not None  # _swept_objects selects objects of a SWEPT kind only
        if id(obj) in named or obj in covered or _type_module(obj).startswith("legato"):
            continue
        if kind_of(obj) is not None and (kind != MODULE or covered.uncovered_tensors(obj)):
            out.append((weakref.ref(obj), kind))
    return out


def _swept_objects() -> list[Any]:
    """The collector's objects of a SWEPT kind, selected by class in C (map, compress): no Python step per object, as the
    sweep runs at every census over every object of the process. Only `type()` is asked of each (isinstance would read
    `__class__`, which some proxies answer with side effects)."""
    objects = gc.get_objects()
    classes = list(map(type, objects))
    try:
        swept = {cls for cls in set(classes) if _kind_of_type(cls) in SWEPT}
        return list(itertools.compress(objects, map(swept.__contains__, classes)))
    except TypeError:  # a class whose metaclass makes it unhashable (none of the kinds) defeats the set: one at a time
        return [obj for obj in objects if _hashable_kind(type(obj)) in SWEPT]


def _hashable_kind(cls: type) -> str | None:
    """`_kind_of_type`, None for a class whose metaclass makes it unhashable (none of the kinds)."""
    try:
        return _kind_of_type(cls)
    except TypeError:
        return None


def _confirmed(candidates: list[tuple[weakref.ref, str]]) -> list[tuple[Any, str]]:
    """The candidates still alive after a collection: garbage waiting in a reference cycle is no state."""
    if not candidates:
        return []
    gc.collect()
    return [(obj, kind) for ref, kind in candidates if (obj := ref()) is not None]


def _holder(obj: Any) -> str:
    """Where an object only the sweep found is held, as far as one step back can tell."""
    for ref in gc.get_referrers(obj):
        if not isinstance(ref, dict):
            continue
        key = next((k for k, v in ref.items() if v is obj), None)
        for owner in gc.get_referrers(ref):
            if isinstance(owner, types.ModuleType) and vars(owner) is ref:
                return f"{key} (global of module {owner.__name__})"
            if getattr(owner, "__dict__", None) is ref:
                return f".{key} of a {_type_name(owner)} (no variable of the stack names it)"
    return "a live object no variable on the stack names (found by the garbage collector)"


# -- what it weighs -------------------------------------------------------------------


def _size(obj: Any, kind: str, covered: Covered) -> str:
    if kind == MODULE:
        return _tensor_size(covered.uncovered_tensors(obj))
    if kind == OPTIMIZER:
        tensors = [v for state in obj.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        params = sum(len(g["params"]) for g in obj.param_groups)
        return f"{params} parameters, state {_tensor_size(tensors)}"
    if kind == SCHEDULER:
        return f"last_epoch {getattr(obj, 'last_epoch', '?')}"
    if kind == TORCH_GENERATOR:
        return f"{obj.get_state().numel()} bytes of state"
    if kind == NUMPY_GENERATOR:
        return f"{type(obj.bit_generator).__name__} state"
    if kind == PYTHON_RANDOM:
        return "Mersenne Twister state"
    if kind == LOADER:
        return f"{obj.num_workers} workers, no generator"
    return "state of unknown size"


def _tensor_size(tensors: list[torch.Tensor]) -> str:
    elements = sum(t.numel() for t in tensors)
    mib = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    return f"{elements:,} elements, {mib:.2f} MiB"


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _saved_by_legato() -> list[Any]:
    """The RNG objects legato saves whatever the user registers: torch's default generators and `random`'s own."""
    cuda = list(torch.cuda.default_generators) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return [torch.default_generator, *cuda, getattr(random, "_inst", None)]

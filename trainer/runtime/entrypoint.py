"""Which function trains: the user's `train.entrypoint` ("pkg.module:function") or the bundled loop, checked before
any rank starts.

`check_entrypoint` is what launchers and the supervisor call before they start
anything: it imports the user's module (a missing module, a module that fails
to import, a missing or uncallable function or a wrong signature is one
paragraph, exit 2), and leaves the bundled loop alone, so that a launcher that
only starts ranks never imports torch itself. This module must never import
torch at its top, and never call the entrypoint.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from legato.config import Config
from legato.errors import UsageError

# Named, not imported: the bundled loop stands on this package (it takes a RunContext) like any user's entrypoint.
BUNDLED_LOOP = "legato.loop:train"


def check_entrypoint(cfg: Config) -> None:
    """Refuse a user entrypoint that cannot be imported or called as fn(ctx), before anything starts (the bundled loop
    needs no check)."""
    if cfg.train.entrypoint is not None:
        resolve_entrypoint(cfg)


def resolve_entrypoint(cfg: Config) -> Callable[[Any], int | None]:
    """The function to call on each rank (with the run context): the user's `pkg.mod:fn` or the bundled loop; a UsageError
    naming the fix when the user's cannot be imported or called so."""
    module_name, _, func_name = (cfg.train.entrypoint or BUNDLED_LOOP).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"train.entrypoint {cfg.train.entrypoint!r}: module {module_name!r} cannot be found or imported ({exc}). "
            "Check the spelling, and that its package is installed or its directory is on PYTHONPATH."
        ) from None
    except Exception as exc:  # the user's module failed while being imported: name it, do not hide it in a traceback
        raise UsageError(
            f"train.entrypoint {cfg.train.entrypoint!r}: importing module {module_name!r} failed with "
            f"{type(exc).__name__}: {str(exc)[:200]}. Fix that module so it imports cleanly."
        ) from None
    func = getattr(module, func_name, None)
    if func is None:
        raise UsageError(
            f"train.entrypoint {cfg.train.entrypoint!r}: module {module_name!r} has no function {func_name!r}. "
            'Name a function that takes the run context, as in "mypkg.train:main".'
        )
    if not callable(func):
        raise UsageError(
            f"train.entrypoint {cfg.train.entrypoint!r}: {func_name!r} in {module_name!r} is a {type(func).__name__}, not a function. "
            'Name a function that takes the run context, as in "mypkg.train:main".'
        )
    _check_signature(cfg.train.entrypoint, func)
    return func


def _check_signature(spec: str | None, func: Callable) -> None:
    """The entrypoint is called as fn(ctx): it must accept exactly one positional argument."""
    try:
        inspect.signature(func).bind(object())
    except ValueError:
        return  # a builtin without introspectable signature: let the call decide
    except TypeError:
        raise UsageError(
            f"train.entrypoint {spec!r} cannot be called with one argument (its signature is {inspect.signature(func)}). "
            "legato calls it as fn(ctx) with the run context; give it exactly one required parameter."
        ) from None

"""The built-in tasks' option schemas: each option's type and range, and the shapes that must fit together.

`train.options` reaches a task as plain values; a wrong type, an impossible
range or a shape that does not fit (heads that do not divide dim, a dataset
smaller than the ranks) would otherwise surface as a traceback deep inside
model or data construction. Options a schema does not name are passed through
untouched (user code may read them). This module must never import torch:
the config is checked with it before anything heavy loads.
"""

from __future__ import annotations

import math
from typing import Any

from legato.errors import UsageError
from legato.tasks.corpus import make_corpus, min_corpus_length

# name -> (type, default, minimum, maximum, what it is)
Schema = dict[str, tuple[type, Any, float, float, str]]

SCHEMAS: dict[str, Schema] = {
    "tiny_gpt": {
        "sentences": (int, 4000, 1, 200_000, "sentences in the generated corpus"),
        "block": (int, 32, 2, 4096, "context length"),
        "dim": (int, 64, 1, 4096, "model width"),
        "layers": (int, 2, 1, 64, "transformer blocks"),
        "heads": (int, 4, 1, 256, "attention heads; must divide dim"),
        "dropout": (float, 0.1, 0.0, 0.99, "dropout probability"),
        "stride": (int, 16, 1, 4096, "distance between training windows"),
        "token_noise": (float, 0.1, 0.0, 1.0, "largest rate of corrupted input tokens"),
    },
    "mlp": {
        "samples": (int, 512, 1, 10_000_000, "synthetic samples"),
        "features": (int, 16, 1, 100_000, "input features"),
        "hidden": (int, 64, 1, 100_000, "hidden width"),
        "dropout": (float, 0.1, 0.0, 0.99, "dropout probability"),
        "jitter": (float, 0.05, 0.0, 1e6, "per-sample input noise"),
        "mixup": (float, 0.4, 1e-3, 1e3, "mixup Beta distribution parameter"),
    },
}
MAX_MLP_VALUES = 200_000_000  # samples x features held in memory


def check_options(task: str, options: dict, world_size: int) -> dict:
    """The options with every named one checked; a UsageError naming `train.options.<key>` otherwise."""
    schema = SCHEMAS[task]
    values = {name: _value(name, options.get(name, default), kind, low, high, what)
              for name, (kind, default, low, high, what) in schema.items()}
    if task == "tiny_gpt":
        _check_tiny_gpt(values, world_size)
    else:
        _check_mlp(values, world_size)
    return values


def _value(name: str, value: Any, kind: type, low: float, high: float, what: str) -> Any:
    key = f"train.options.{name}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        word = "an integer" if kind is int else "a number"
        raise UsageError(f"{key} ({what}) must be {word}, but it is {_show(value)}. Write it as {word}, without quotes.")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{key} ({what}) is {value!r}; it must be a finite number from {low:g} to {high:g}.")
    if not low <= value <= high:
        raise UsageError(f"{key} ({what}) is {_show(value)}; it must be from {low:g} to {high:g}. Set a value in that range.")
    return kind(value)


def _check_tiny_gpt(v: dict, world_size: int) -> None:
    if v["dim"] % v["heads"]:
        raise UsageError(
            f"train.options.heads is {v['heads']}, which does not divide train.options.dim ({v['dim']}): each head gets dim/heads "
            "channels. Pick heads that divide dim, such as 4 for dim 64."
        )
    if _windows(min_corpus_length(v["sentences"]), v) >= world_size:
        return
    windows = _windows(len(make_corpus(v["sentences"], seed=0)), v)
    if windows < world_size:
        raise UsageError(
            f"train.options: {v['sentences']} sentences give {max(windows, 0)} training windows of block {v['block']} and stride "
            f"{v['stride']}, fewer than the {world_size} ranks. Raise sentences, or lower block or stride."
        )


def _windows(tokens: int, v: dict) -> int:
    return (tokens - v["block"] - v["stride"] - 1) // v["stride"]


def _check_mlp(v: dict, world_size: int) -> None:
    if v["samples"] < world_size:
        raise UsageError(f"train.options.samples is {v['samples']}, fewer than the {world_size} ranks. Give every rank at least one "
                         "sample.")
    if v["samples"] * v["features"] > MAX_MLP_VALUES:
        raise UsageError(
            f"train.options: {v['samples']} samples of {v['features']} features would hold {v['samples'] * v['features']:,} values "
            f"in memory, more than {MAX_MLP_VALUES:,}. Lower samples or features."
        )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The built-in tasks' option schemas: each option's type and range, and the shapes that must fit together.

`train.options` reaches a task as plain values; a wrong type, an impossible
range or a shape that does not fit (heads that do not divide dim, a rank's
share of the data smaller than a batch, a batch of one under batch norm, a
model far beyond any memory) would otherwise surface as a traceback on one
rank deep inside model or data construction, and as gloo's "connection closed"
on its peers. Options a schema does not name are passed through untouched
(user code may read them), unless the name is a near miss of one it does. This module must never import torch:
the config is checked with it before anything heavy loads.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from legato.errors import UsageError
from legato.tasks.corpus import make_corpus, max_corpus_length, min_corpus_length

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
MAX_TASK_BYTES = 32 * 2**30  # a demo task's estimated memory per rank: far above any demo, far below a traceback
VOCAB = 64  # the generated corpus has fewer distinct characters than this


def check_options(task: str, options: dict, world_size: int, batch_size: int) -> dict:
    """The options with every named one checked; a UsageError naming `train.options.<key>` otherwise."""
    schema = SCHEMAS[task]
    _check_names(task, options, schema)
    values = {
        name: _value(name, options.get(name, default), kind, low, high, what) for name, (kind, default, low, high, what) in schema.items()
    }
    if task == "tiny_gpt":
        _check_tiny_gpt(values, world_size, batch_size)
    else:
        _check_mlp(values, world_size, batch_size)
    return values


def _check_names(task: str, options: dict, schema: Schema) -> None:
    """An unknown option that is a near miss of a known one is a typo, which would silently leave the default in place."""
    for name in options:
        close = difflib.get_close_matches(name, [n for n in schema if n != name], n=1, cutoff=0.8) if name not in schema else []
        if close:
            raise UsageError(
                f"train.options.{name} is not an option of the {task} task, so it would be ignored. Did you mean "
                f"train.options.{close[0]}? Fix the name."
            )


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


def _check_tiny_gpt(v: dict, world_size: int, batch_size: int) -> None:
    if v["dim"] % v["heads"]:
        raise UsageError(
            f"train.options.heads is {v['heads']}, which does not divide train.options.dim ({v['dim']}): each head gets dim/heads "
            "channels. Pick heads that divide dim, such as 4 for dim 64."
        )
    _check_memory("tiny_gpt", "dim, layers, block", _tiny_gpt_bytes(v, batch_size), batch_size)
    need = world_size * batch_size
    if _windows(min_corpus_length(v["sentences"]), v) >= need:
        return
    # Generate the corpus only when its bounds cannot decide (it takes seconds at the largest sizes).
    upper = _windows(max_corpus_length(v["sentences"]), v)
    counted = f"at most {max(upper, 0)}"
    if upper >= need:
        windows = _windows(len(make_corpus(v["sentences"], seed=0)), v)
        if windows >= need:
            return
        counted = str(max(windows, 0))
    raise UsageError(
        f"train.options: {v['sentences']} sentences give {counted} training windows of block {v['block']} and stride "
        f"{v['stride']}, fewer than the {world_size} ranks times train.batch_size {batch_size} ({need}), so a rank would have "
        "no full batch. Raise sentences, or lower block, stride or train.batch_size."
    )


def _windows(tokens: int, v: dict) -> int:
    return (tokens - v["block"] - v["stride"] - 1) // v["stride"]


def _tiny_gpt_bytes(v: dict, batch_size: int) -> int:
    """About what one rank holds: fp32 weights, gradients and AdamW's two moments, and the activations of one batch."""
    dim, layers, block = v["dim"], v["layers"], v["block"]
    params = layers * (12 * dim * dim + 13 * dim) + 2 * VOCAB * dim + block * dim
    activations = batch_size * block * layers * (34 * dim + 5 * v["heads"] * block)
    return 16 * params + 4 * activations


def _check_mlp(v: dict, world_size: int, batch_size: int) -> None:
    if batch_size < 2:
        raise UsageError(
            "train.batch_size is 1, but the mlp task's batch norm needs at least 2 samples in a batch to train. Set "
            "train.batch_size to 2 or more."
        )
    if v["samples"] < world_size * batch_size:
        raise UsageError(
            f"train.options.samples is {v['samples']}, fewer than the {world_size} ranks times train.batch_size "
            f"{batch_size}, so a rank would have no full batch. Raise samples, or lower train.batch_size."
        )
    if v["samples"] * v["features"] > MAX_MLP_VALUES:
        raise UsageError(
            f"train.options: {v['samples']} samples of {v['features']} features would hold {v['samples'] * v['features']:,} values "
            f"in memory, more than {MAX_MLP_VALUES:,}. Lower samples or features."
        )
    params = (v["features"] + 6) * v["hidden"] + 1
    _check_memory("mlp", "hidden, features", 16 * params + 4 * batch_size * (v["features"] + 5 * v["hidden"]), batch_size)


def _check_memory(task: str, knobs: str, estimate: int, batch_size: int) -> None:
    if estimate <= MAX_TASK_BYTES:
        return
    raise UsageError(
        f"train.options: this {task} with train.batch_size {batch_size} needs about {estimate / 2**30:,.0f} GiB on each rank "
        f"(weights, gradients, optimizer state, activations), more than the {MAX_TASK_BYTES // 2**30} GiB a built-in demo task may "
        f"take. Lower {knobs} or train.batch_size, or train your own model with train.entrypoint."
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

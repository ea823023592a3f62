"""Built-in tasks: small models with data made on the spot, for demos, tests and benchmarks.

A task builds a model, a dataset and a loss from plain options; it never
touches the network, the filesystem or the global RNGs outside model init.
"""

from __future__ import annotations

from legato.tasks.task import Task


def build_task(name: str, options: dict, seed: int) -> Task:
    """The built-in task `name` ("tiny_gpt" or "mlp") built from its options; a ValueError for any other name."""
    if name == "tiny_gpt":
        from legato.tasks.tiny_gpt import build
    elif name == "mlp":
        from legato.tasks.mlp import build
    else:
        raise ValueError(f"unknown task {name!r}")
    return build(options, seed)

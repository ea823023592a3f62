"""A small English-like text corpus generated from a fixed grammar (no download).

Pure function of its seed; uses its own `random.Random`, never the global one.
"""

from __future__ import annotations

import random

_SUBJECTS = [
    "the cluster",
    "a job",
    "every rank",
    "the scheduler",
    "our model",
    "the node",
    "a checkpoint",
    "the user",
    "the optimizer",
    "each worker",
]
_VERBS = ["waits for", "writes", "restores", "signals", "trains", "requeues", "verifies", "reads", "hashes", "resumes"]
_OBJECTS = [
    "the state",
    "a barrier",
    "its shard",
    "the manifest",
    "every step",
    "the loss",
    "a random seed",
    "the data",
    "one epoch",
    "the gradient",
]
_TAILS = [
    "before the limit",
    "after the signal",
    "bit for bit",
    "on every rank",
    "without loss",
    "in one pass",
    "at the boundary",
    "again and again",
]


def make_corpus(n_sentences: int = 4000, seed: int = 0) -> str:
    """A synthetic English-like text of `n_sentences` random sentences, the same for the same seed."""
    rnd = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        words = [rnd.choice(_SUBJECTS), rnd.choice(_VERBS), rnd.choice(_OBJECTS)]
        if rnd.random() < 0.5:
            words.append(rnd.choice(_TAILS))
        lines.append(" ".join(words) + rnd.choice([".", ".", "!", "?"]))
    return " ".join(lines)


def min_corpus_length(n_sentences: int) -> int:
    """A lower bound of `len(make_corpus(n_sentences))`, without generating it."""
    shortest = sum(min(len(w) for w in words) for words in (_SUBJECTS, _VERBS, _OBJECTS)) + 2 + 1
    return n_sentences * (shortest + 1) - 1


def max_corpus_length(n_sentences: int) -> int:
    """An upper bound of `len(make_corpus(n_sentences))`, without generating it."""
    longest = sum(max(len(w) for w in words) for words in (_SUBJECTS, _VERBS, _OBJECTS, _TAILS)) + 3 + 1
    return n_sentences * (longest + 1) - 1

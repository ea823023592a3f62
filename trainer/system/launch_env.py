"""The environment a rank must start with for strict determinism, set by every launcher of legato.

Two settings cannot be made from inside a running rank: `PYTHONHASHSEED` is read
when the interpreter starts, and `CUBLAS_WORKSPACE_CONFIG` when CUDA starts (an
environment capture or a user import may start it before the seeds are set).
Launchers put both into the ranks' environment unless the user already chose a
value. `ATEN_CPU_CAPABILITY`, read when torch first picks a CPU kernel, pins the
kernels' instruction set so that a run resumes on a node of another CPU kind
(legato.store.manifest names it when the set differs); it is passed on only as
the user set it, into the job script too, so that a cluster whose sbatch
exports no environment still hands it to the ranks. Free of torch: the
supervisor imports it. It must never overwrite a value the user set.
"""

from __future__ import annotations

from collections.abc import Mapping

HASH_SEED = "0"
CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's deterministic workspace setting (see torch's reproducibility notes)
PASSED_ON = ("ATEN_CPU_CAPABILITY",)


def determinism_environ(current: Mapping[str, str]) -> dict[str, str]:
    """The variables to set for the ranks: the user's own values where `current` has them, legato's otherwise."""
    return {
        "PYTHONHASHSEED": current.get("PYTHONHASHSEED", HASH_SEED),
        "CUBLAS_WORKSPACE_CONFIG": current.get("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE),
        **{name: current[name] for name in PASSED_ON if name in current},
    }

"""Loss curves as a PNG: reference and resumed runs overlaid, resume points, replays, lost work and the first divergence
marked.

matplotlib is optional (`pip install 'legato[plot]'`); without it `plot_losses`
returns None and the caller says how to get it. Losses are read from the
trajectories (`float.fromhex` of the exact bits); this module only draws.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from legato.events import Kind
from legato.paths import RunPaths
from legato.store.trajectory import read_trajectory


def losses(run_dir: Path, rank: int = 0) -> tuple[list[int], list[float]]:
    """The steps and losses (from their `float.hex` records) in one rank's trajectory of a run."""
    records = [r for r in read_trajectory(RunPaths(run_dir).trajectory(rank)) if r.get("loss_hex")]
    return [r["step"] for r in records], [float.fromhex(r["loss_hex"]) for r in records]


def replay_spans(resumes: list[dict]) -> list[tuple[int, int]]:
    """(base step, resumed step) of every resume that replayed."""
    return [(r["replay"]["from_step"], r["step"]) for r in resumes if r.get("replay")]


def lost_spans(events: list[dict]) -> list[tuple[int, int]]:
    """(checkpoint step, last step trained) of every span an attempt trained and a kill threw away (`work_lost`)."""
    return [(e["step"], e["trained_to"]) for e in events if e["event"] == Kind.WORK_LOST]


def plot_losses(
    out: Path,
    runs: dict[str, Path],
    resumes: list[int],
    divergence: int | None = None,
    replays: Sequence[tuple[int, int]] = (),
    lost: Sequence[tuple[int, int]] = (),
) -> Path | None:
    """Draw the runs' losses; `replays` are the (base step, resumed step) spans each resume replayed, `lost` the spans a
    kill threw away (trained again by the next attempt)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    styles: Iterator[dict[str, Any]] = iter([{"lw": 2.5, "alpha": 0.45}, {"lw": 1.0, "ls": "--"}, {"lw": 1.0, "ls": ":"}])
    for label, run_dir in runs.items():
        steps, values = losses(run_dir)
        ax.plot(steps, values, label=label, **next(styles))
    for i, step in enumerate(resumes):
        ax.axvline(step, color="tab:green", lw=0.8, ls="--", label="resume" if i == 0 else None)
    for i, (base, step) in enumerate(replays):
        ax.axvspan(base, step, color="tab:green", alpha=0.12, label="replayed on resume" if i == 0 else None)
    for i, (start, end) in enumerate(lost):
        ax.axvspan(start, end, color="tab:red", alpha=0.12, hatch="//", label="lost to a kill, trained again" if i == 0 else None)
    if divergence is not None:
        ax.axvline(divergence, color="tab:red", lw=1.5, label=f"first divergence (step {divergence})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (rank 0)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out

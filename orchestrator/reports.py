"""How the CLI words a verification verdict and environment captures for people.

Part of the CLI (the only layer that formats for people), beside display.py,
which words runs. Each function turns plain data into lines of text; this
module must never print, read files or decide an exit code.
"""

from __future__ import annotations

import time
from pathlib import Path

from legato.events import resharded_label
from legato.orchestrator.repro_diff import SectionDiff
from legato.orchestrator.verify import Verdict, rng_words


def verdict_lines(verdict: Verdict, png: Path | None) -> list[str]:
    """The verdict in words: identical (with counts), or where and why the runs part; then where the plot is."""
    lines = []
    if verdict.identical and verdict.unseeded:
        lines.append(
            f"legato: training bitwise identical: {verdict.steps} steps, {_resumes(verdict)}, every loss bit and every "
            f"component but {', '.join(verdict.unseeded)} equal at {verdict.checkpoints_compared} checkpoints"
        )
        lines.append(
            f"legato: note: the script's unseeded {rng_words(verdict.unseeded)} differ between any two runs "
            f"(training never draws from them), so the final hashes differ ({verdict.reference_final_hash} vs "
            f"{verdict.run_final_hash}); seed them (random.seed, numpy.random.seed, or legato.seed_everything) for one hash"
        )
    elif verdict.identical:
        lines.append(
            f"legato: bitwise identical: {verdict.steps} steps, {_resumes(verdict)}, "
            f"{verdict.checkpoints_compared} checkpoints compared, final hash {verdict.run_final_hash}"
        )
    else:
        d = verdict.divergence
        if d is not None:
            loss = f"; loss {d.reference_loss} vs {d.run_loss}" if d.loss_differs else ""
            lines.append(f"legato: DIVERGED at step {d.step}, rank {d.rank}: {', '.join(d.components) or 'loss only'} differ{loss}")
        else:
            lines.append(f"legato: NOT identical: final hash {verdict.reference_final_hash} vs {verdict.run_final_hash}")
        lines.append(f"legato: likely cause: {verdict.cause}")
    lines += [
        f"legato: the resume at step {r['step']} was {resharded_label(r['resharded'])}" for r in verdict.resumes if r.get("resharded")
    ]
    lines.append(f"legato: plot: {png}" if png else "legato: no plot: install matplotlib (pip install 'legato[plot]') for the PNG")
    return lines


def _resumes(verdict: Verdict) -> str:
    """ "2 resumes (2 replay-verified)": each resume the ranks proved by replaying steps, from its ledger record."""
    replayed = sum(1 for r in verdict.resumes if r.get("match") and (r.get("replay") or {}).get("identical"))
    return f"{len(verdict.resumes)} resumes ({replayed} replay-verified)"


def capture_lines(path: Path, manifest: dict, texts: dict[str, str], sections: list[str]) -> list[str]:
    """A capture: where, when and how long it took, each external command's outcome, then the chosen sections (all when none)."""
    labels = ", ".join(f"{k} {v}" for k, v in manifest["labels"].items())
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(manifest["time"]))
    lines = [f"capture {path}: {labels or 'unsupervised'}; host {manifest['host']}; {when}; took {manifest['capture_seconds']:.2f}s"]
    for name, cmd in manifest["commands"].items():
        lines.append(f"  {name}: {'ok' if cmd['ok'] else 'FAILED: ' + cmd['error']} ({cmd['seconds']:.2f}s)")
    for name, text in texts.items():
        if not sections or name in sections:
            lines.append(f"\n== {name} ==\n{text.rstrip()}")
    return lines


def capture_diff_lines(a: Path, b: Path, diffs: list[SectionDiff]) -> list[str]:
    """What differs between two captures, section by section."""
    if not diffs:
        return [f"legato: no difference between {a} and {b}"]
    lines = [f"legato: {a} -> {b}: {len(diffs)} section(s) differ"]
    for d in diffs:
        lines.append(f"\n== {d.section} ==")
        lines += [f"  {line}" for line in d.lines]
    return lines

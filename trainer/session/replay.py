"""Replay-verified resume: the snapshot a run keeps for it, what each step records, and the verdict.

Every `checkpoint.replay_steps` (K) steps, when the ranks agree that the base
is older than `checkpoint.replay_seconds` (legato.session.base_clock), and at
the step a process starts from, the Session copies this rank's share of the state (what it writes) into CPU
memory that is allocated once and reused (`Snapshot`): the replay base, step B. From then on
each step appends a small record (`step_record`: the loss bits, a fingerprint
of the batch the session yielded, and after the first step past B a
fingerprint of the gradients). A checkpoint at step N is written with the
base B (N-K <= B < N) and the records of steps B+1..N. A resume restores B,
runs B+1..N again through the user's own loop, and `ReplayCheck` compares each
step's record and, at N, every component digest; `judge` turns the ranks'
reports into one verdict naming the first divergent step, the rank, the
components that differ at N and the likely cause.

A batch or gradients on an accelerator are fingerprinted from a sample copied
on their device, read back when a capture saves the records or a replay
compares them (`HeldFingerprint`): no step waits for the device for them.

Comparisons are of exact bits (float.hex, XXH3-128 digests). The fingerprints
only serve to name a cause; the proof is the loss bits and the digests. This
module must never draw from an RNG or touch the process group.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import xxhash

from legato.session.losses import HeldLoss, Loss, hex_of
from legato.state.recipes import SHARE
from legato.state.snapshot import Snapshot

# A CPU tensor up to this size is fingerprinted whole: XXH3 reads it at memory speed, about what reading the strided
# sample costs (the sample touches every cache line of a batch), so every byte counts at no extra cost.
WHOLE_BYTES = 1 << 22
FINGERPRINT_BYTES = 1 << 14  # a bigger tensor, or one on an accelerator: an evenly strided sample of this size


def base_share(rank: int, snapshot: Snapshot, window: list[dict]) -> dict:
    """A rank's replay base for a checkpoint: the base's step, its share of the digests (completed with the other ranks'
    when the reports meet: legato.store.commit.complete), and the records of the steps since."""
    return {"rank": rank, "from_step": snapshot.step, SHARE: snapshot.share(), "steps": list(window)}


HOLD_CPU = False
"""Whether CPU tensors' fingerprints in step records are held as a device's are (tests turn it on); a CPU tensor is hashed
at once, since reading it waits for nothing."""

HELD_STEPS = 256  # held fingerprints are read back once this many are held (about as many steps): one wait, not one a step
HELD_BYTES = 64 << 20  # or once their copies hold this much (a big CPU tensor in a batch with device tensors)
NONE = b"none;"  # what stands for a missing tensor (a parameter without a gradient)


def fingerprint(tensors: Iterable[torch.Tensor | None]) -> str:
    """XXH3-128 over dtypes, shapes and the bytes of `tensors` (all of a CPU tensor up to WHOLE_BYTES, else an evenly
    strided sample), 32 hex digits."""
    h = xxhash.xxh3_128()
    for t in tensors:  # a plain loop, helpers inlined but two: a CPU batch is fingerprinted at every step
        if t is None:
            h.update(NONE)
            continue
        h.update(_header(t))
        _add(h, _sample(t))
    return h.hexdigest()


class HeldFingerprint:
    """A fingerprint whose sampled bytes are still on their device: copied there at once (the loop may write into its
    batch, the next step into the gradients), read back and hashed when the value is first asked for, so that no step
    waits for the device to fingerprint. The value is the one `fingerprint` gives for the same tensors."""

    __slots__ = ("_parts", "_value", "nbytes")

    def __init__(self, tensors: Sequence[torch.Tensor | None]) -> None:
        # A CPU tensor among device ones is copied too: hashing it now would put its bytes before an earlier tensor's.
        parts = [None if t is None else (_header(t), _sample(t).clone(memory_format=torch.contiguous_format)) for t in tensors]
        self._parts: list[tuple[bytes, torch.Tensor] | None] | None = parts
        self._value: str | None = None
        self.nbytes = sum(part[1].nbytes for part in parts if part is not None)  # what the copies hold

    def __call__(self) -> str:
        if self._parts is not None:
            h = xxhash.xxh3_128()
            for part in self._parts:
                if part is None:
                    h.update(NONE)
                    continue
                h.update(part[0])
                _add(h, part[1])
            self._value, self._parts = h.hexdigest(), None
        assert self._value is not None
        return self._value


Fingerprint = str | HeldFingerprint


def take_fingerprint(tensors: Sequence[torch.Tensor | None]) -> Fingerprint:
    """The fingerprint of tensors the loop goes on to change (a batch, the gradients) for a step record: hashed at once
    when they are on the CPU, held when any is on a device."""
    for t in tensors:
        if HOLD_CPU or (t is not None and not t.is_cpu):
            return HeldFingerprint(tensors)
    return fingerprint(tensors)


def settle_record(record: dict) -> None:
    """Put the values of a step record's held fingerprints in their place (a record is saved and compared as plain data)."""
    for key in ("batch", "grads"):
        held = record.get(key)
        if isinstance(held, HeldFingerprint):
            record[key] = held()


def _header(t: torch.Tensor) -> bytes:
    return f"{t.dtype}{tuple(t.shape)}:".encode()


def _sample(t: torch.Tensor) -> torch.Tensor:
    """The elements of `t` its fingerprint hashes, flat: all of a CPU tensor up to WHOLE_BYTES, else an evenly strided
    sample of FINGERPRINT_BYTES."""
    flat = t.detach().reshape(-1)
    whole = t.device.type == "cpu" and t.nbytes <= WHOLE_BYTES
    limit = max(1, FINGERPRINT_BYTES // max(1, t.element_size()))
    if not whole and flat.numel() > limit:
        flat = flat[:: -(-flat.numel() // limit)]
    return flat


def _add(h: xxhash.xxh3_128, flat: torch.Tensor) -> None:
    if flat.numel():
        # An ndarray is a buffer; numpy's stubs say so only for Python >= 3.12 (`__buffer__`).
        h.update(flat.cpu().contiguous().view(torch.uint8).numpy())  # type: ignore[arg-type]


NO_TENSORS = fingerprint([])  # a batch without tensors (a Session without a loader yields the step index)


def comparable(recorded: str | None, replayed: str | None) -> bool:
    """Whether two fingerprints were taken by the same rule: a checkpoint of an older legato holds SHA-256 ones (16 hex
    digits, against XXH3-128's 32), which name no cause here; its loss bits and digests still prove the replay."""
    return recorded is None or replayed is None or len(recorded) == len(replayed)


class HeldBatches:
    """Notices a batch that outlives its step: the sign of a loop that prefetches outside the session."""

    def __init__(self) -> None:
        self._previous: list[weakref.ref] = []
        self._current: list[weakref.ref] = []
        self.held_at: int | None = None  # first step at whose end an earlier step's batch was still alive

    def yielded(self, tensors: list[torch.Tensor]) -> None:
        self._previous, self._current = self._current, [weakref.ref(t) for t in tensors]

    def step_ended(self, step: int) -> None:
        if self.held_at is None and self._previous and any(ref() is not None for ref in self._previous):
            self.held_at = step
        self._previous = []


def step_record(step: int, loss: Loss | None, batch: Fingerprint | None, grads: Fingerprint | None) -> dict:
    """One step's trajectory record: the loss as `float.hex`, the batch fingerprint, and the gradients' digest when given.
    A loss still on its device is a function until it is read back (every capture reads it back, before any record is
    saved; a record saved before would fail to serialize, never say "no loss"); a held fingerprint likewise, until
    `settle_record`."""
    record: dict[str, Any] = {"step": step, "loss_hex": hex_of(loss), "batch": batch}
    if isinstance(loss, HeldLoss) and not loss.read:
        loss.then(lambda value: record.__setitem__("loss_hex", value.hex()))
    if grads is not None:
        record["grads"] = grads
    return record


@dataclass
class RankReport:
    """What one rank saw in its replay."""

    rank: int
    loss_step: int | None = None  # first step whose loss bits differ
    loss_bits: tuple[str | None, str | None] | None = None  # (recorded, replayed) at that step
    batch_step: int | None = None  # first step whose batch differs
    grads_step: int | None = None  # the step after the base, when its gradients differ
    held_at: int | None = None
    unrestored: list[str] = field(default_factory=list)  # base components that did not restore to their digests
    differing: list[str] = field(default_factory=list)  # components whose digests differ at N

    @property
    def first_step(self) -> int | None:
        steps = [s for s in (self.loss_step, self.batch_step, self.grads_step) if s is not None]
        return min(steps) if steps else None

    @property
    def diverged(self) -> bool:
        return bool(self.first_step is not None or self.unrestored or self.differing)


class ReplayCheck:
    """Compares this rank's replayed steps with what the interrupted attempt recorded."""

    def __init__(self, rank: int, from_step: int, to_step: int, recorded: list[dict], unrestored: list[str]) -> None:
        self.from_step, self.to_step = from_step, to_step
        self.recorded = {r["step"]: r for r in recorded}
        self.report = RankReport(rank, unrestored=unrestored)

    def check(self, record: dict) -> None:
        step, want, r = record["step"], self.recorded.get(record["step"], {}), self.report
        if r.loss_step is None and want.get("loss_hex") != record["loss_hex"]:
            r.loss_step, r.loss_bits = step, (want.get("loss_hex"), record["loss_hex"])
        settle_record(record)
        if r.batch_step is None and want.get("batch") != record["batch"] and comparable(want.get("batch"), record["batch"]):
            r.batch_step = step
        grads = want.get("grads")
        if r.grads_step is None and grads is not None and grads != record.get("grads") and comparable(grads, record.get("grads")):
            r.grads_step = step


@dataclass
class Verdict:
    """The replay's outcome over all ranks, as it goes into the ledger."""

    from_step: int
    steps: int
    identical: bool
    first_divergence: dict | None = None  # step, rank, components (differing at N), loss bits, cause
    differing_at_end: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0  # the replay's own time: from the restored base to the verdict, on this rank

    def to_event(self) -> dict:
        return asdict(self)


def judge(from_step: int, to_step: int, reports: list[RankReport], loader: bool = True, unregistered: list[str] | None = None) -> Verdict:
    """Combine every rank's report of a replay from `from_step` to `to_step` into one Verdict (the first divergence, if any);
    `loader`: whether the Session feeds the loop from a loader (else the loop draws its own batches); `unregistered`: what
    the census found unsaved in this run."""
    verdict = Verdict(from_step, to_step - from_step, identical=not any(r.diverged for r in reports))
    verdict.differing_at_end = {str(r.rank): r.differing for r in reports if r.differing}
    if verdict.identical:
        return verdict
    first = min((r for r in reports if r.diverged), key=lambda r: (r.first_step or to_step, r.rank))
    verdict.first_divergence = {
        "step": first.first_step or to_step,
        "rank": first.rank,
        "components": first.differing,
        "loss_bits": list(first.loss_bits) if first.loss_bits else None,
        "unrestored": sorted({n for r in reports for n in r.unrestored}),
        "cause": likely_cause(first, from_step, loader, unregistered or []),
    }
    return verdict


def likely_cause(r: RankReport, from_step: int, loader: bool = True, unregistered: list[str] | None = None) -> str:
    """The most likely reason for a rank's divergence, in plain words with the fix, for the loop's kind (`loader`) and what the
    census found unsaved (`unregistered`)."""
    if r.unrestored:
        return (
            f"the restore left {', '.join(r.unrestored)} unrestored: the replay base (step {from_step}) does not hash to "
            "what was saved, so the replay started from another state"
        )
    if unregistered and r.loss_step is None:
        return _unregistered_cause(r, from_step, unregistered)
    if r.batch_step is not None and r.batch_step == r.first_step:
        return (
            f"the batch of step {r.batch_step} differs from the one the interrupted attempt trained on: randomness drawn "
            "inside DataLoader workers from the global torch/numpy/python RNG (worker-side augmentation) depends on where "
            "the run was cut; pass your own DataLoader with Session(worker_rng=True), which seeds them per sample, or draw each "
            "sample's randomness from legato.sample_generator(seed, epoch, index)"
        )
    if r.grads_step is not None and (r.loss_step is None or r.grads_step < r.loss_step):
        return (
            f"partial gradients: after step {r.grads_step} the gradients differ while its loss does not, so the .grad "
            "sums carried into that step were lost; the run stopped in the middle of a gradient accumulation (no_sync "
            "micro-steps). The session saves every .grad; gradients accumulated anywhere else must be registered with the "
            "session as an extra, or accumulate within one step"
        )
    if r.held_at is not None:
        return (
            f"a prefetched batch: a batch the session yielded was still alive at the end of step {r.held_at}, so the "
            "loop trains on a batch it keeps between steps, outside the checkpoint; train on the batch the session "
            "yields, or register the held batch with the session as an extra"
        )
    also = f"; the census also named state legato does not save in this run: {', '.join(unregistered)}" if unregistered else ""
    return _fallback_cause(from_step, loader) + also


def _fallback_cause(from_step: int, loader: bool) -> str:
    if not loader:
        # A loop that draws its own batches and prefetches one (nanoGPT's get_batch) holds it across the stop; the session
        # sees no batch, so held_at cannot name it: it is the commonest state a loop without a loader keeps outside.
        return (
            f"a batch drawn before the stop and not carried: the loop draws its own batches and holds one from step to step "
            f"(a prefetch, or the first batch drawn before the loop), so after the restore of step {from_step} it trained on "
            "another batch than the interrupted attempt; register it with session.carry(): X, Y = session.carry(get_batch()) "
            "before the loop and at each prefetch. Less likely: a torch.Generator the loop draws from but did not pass to the "
            "session as an extra"
        )
    return (
        "state outside the checkpoint feeds training: a torch.Generator (or other RNG) that the loop draws from but did "
        "not register, or random numbers were drawn between the restore and the first step; pass it to the session as "
        "an extra (anything with state_dict/load_state_dict)"
    )


def _unregistered_cause(r: RankReport, from_step: int, unregistered: list[str]) -> str:
    differing = f" and {', '.join(r.differing)} followed" if r.differing else ""
    return (
        f"state legato does not save: the census named {', '.join(unregistered)} in this run (objects that change during "
        f"training and are not registered); after the restore of step {from_step} they held other values than in the "
        f"interrupted attempt{differing}. Register each one (extras={{'name': legato.attributes(obj)}} for an object of plain "
        "attributes such as a meter or a saver, the object itself when it has state_dict/load_state_dict), or mark one that "
        "does not matter with session.ignore(obj)"
    )


def describe(verdict: Verdict, guess: bool = True) -> str:
    """One sentence for logs and errors; without `guess` it stops before the likely cause (the caller knows the cause)."""
    span = f"steps {verdict.from_step + 1}..{verdict.from_step + verdict.steps}"
    if verdict.identical:
        return f"replay of {span} identical"
    d = verdict.first_divergence or {}
    bits = f" (loss {d['loss_bits'][0]} recorded, {d['loss_bits'][1]} replayed)" if d.get("loss_bits") else ""
    at_end = "; ".join(f"rank {r}: {', '.join(n)}" for r, n in verdict.differing_at_end.items()) or "none"
    found = (
        f"replay of {span} diverged first at step {d.get('step')} on rank {d.get('rank')}{bits}; components differing at "
        f"step {verdict.from_step + verdict.steps}: {at_end}"
    )
    return f"{found}. Likely cause: {d.get('cause')}" if guess else found

"""The device rule: a tensor's 16-byte digest computed where the tensor lives, in integer arithmetic that gives the same
bytes on every device.

XXH3 runs on the host: digesting a GPU tensor with it moves the tensor's bytes over the bus first, so every state hash
and every resume's check would read the whole state off the GPU. Under this rule the bytes stay where they are. They are
read as 64-bit words (the last bytes that fill no word zero-padded into one), each word mixed by a bijection, then
summed with a key per column of 4096-word rows and a key per row, in two lanes with independent keys:

    x = w ^ (w >>> 32);  x = x * K;  x = x ^ (x >>> 29)               (a bijection of the word)
    lane = sum over rows m of  row_key[m] * sum over columns j of  col_key[j] * x[m, j]     (mod 2**64)

Sums modulo 2**64 do not depend on the order a kernel reduces them in, on thread counts or on the device, so a CPU
computes the same digest as a GPU from the same bytes (tests/unit/test_device_digest.py holds a plain-Python
reference). Every key is odd and the mix is a bijection, so a change confined to one word, of any number of its
bits, always changes both lanes; keys that differ by position catch values that trade places. The digest is
XXH3-128 of the rule's name, the byte count and the two lanes.

Which tensors follow this rule (those on a CUDA device) is legato.state.hashing's to say. This module must never move
a tensor's bytes off its device (two sums travel), write to the tensor, or draw from an RNG.
"""

from __future__ import annotations

import threading

import torch
import xxhash

RULE = "legato-words64-v1"
ROW_WORDS = 4096
CHUNK_ROWS = 1024  # rows mixed at once: 32 MiB of words, three such temporaries at most while a digest runs
MIX = 0x9E3779B97F4A7C15  # the mix's multiplier, odd
# Seeds of the key streams: the column and row keys of lane 0, then of lane 1.
SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 torch multiplies by."""
    return value - (1 << 64) if value >> 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's `>>` on int64 copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    """How the keys are drawn from their positions: multiply and xor-shift twice, with SplitMix64's constants."""
    x = x * _signed(0xBF58476D1CE4E5B9)
    x = x ^ _shift_right(x, 30)
    x = x * _signed(0x94D049BB133111EB)
    return x ^ _shift_right(x, 31)


def _mix(words: torch.Tensor) -> torch.Tensor:
    """The bijection of each word, in place on one temporary (the input is only read)."""
    x = words >> 32
    x &= (1 << 32) - 1
    x ^= words
    x *= _signed(MIX)
    x ^= _shift_right(x, 29)
    return x


class _Keys:
    """Odd keys by position, drawn once per device and grown to the longest tensor seen.

    A GPU's keys are drawn on the stream that first needs them, and that stream is waited for before they are handed
    out (and before a shorter set is let go), so a digest on any stream reads them whole. Growing is rare: the first
    digest of a process, then a few times at most.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device, seed: int, n: int) -> torch.Tensor:
        with self._lock:
            held = self._held.get((str(device), seed))
            if held is None or held.numel() < n:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # nothing still reads the shorter set when it goes
                # At least twice the set it replaces: a longer tensor's first digest draws its keys once, not chunk by chunk.
                size = max(n, ROW_WORDS, 2 * (held.numel() if held is not None else 0))
                positions = torch.arange(size, dtype=torch.int64, device=device)
                held = _splitmix(positions + _signed(seed)) | 1
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                self._held[(str(device), seed)] = held
            return held[:n]


_keys = _Keys()


def word_aligned_bytes(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes, flat, on its device, starting on an 8-byte boundary so that int64 words can be read from them: a
    view where the memory allows, else a copy (a GPU faults on a misaligned load)."""
    data = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return data.clone() if data.data_ptr() % 8 else data


def words(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor's bytes as int64 words on its device: the whole words (a view where alignment allows), and the last
    bytes that fill no word zero-padded into one (an empty tensor when there are none)."""
    data = word_aligned_bytes(t)
    bulk = data.numel() // 8 * 8
    padded = torch.zeros(8 if bulk < data.numel() else 0, dtype=torch.uint8, device=data.device)
    padded[: data.numel() - bulk] = data[bulk:]
    return data[:bulk].view(torch.int64), padded.view(torch.int64)


def lanes(t: torch.Tensor) -> torch.Tensor:
    """The rule's two 64-bit lanes of `t`'s bytes, as two int64 on `t`'s device (queued there: nothing waits for it)."""
    whole, tail = words(t)
    device = whole.device
    full = whole.numel() // ROW_WORDS * ROW_WORDS
    matrix = whole[:full].view(-1, ROW_WORDS)
    last = torch.cat([whole[full:], tail])  # the row the whole rows leave: fewer than ROW_WORDS words
    rows = matrix.shape[0] + (1 if last.numel() else 0)
    keys = [(_keys.get(device, SEEDS[2 * lane], ROW_WORDS), _keys.get(device, SEEDS[2 * lane + 1], rows)) for lane in range(2)]
    total = torch.zeros(2, dtype=torch.int64, device=device)
    for start in range(0, matrix.shape[0], CHUNK_ROWS):
        block = matrix[start : start + CHUNK_ROWS]
        total += _lanes_of_rows(_mix(block), [(columns, by_row[start : start + block.shape[0]]) for columns, by_row in keys])
    if last.numel():
        total += _lanes_of_rows(_mix(last).view(1, -1), [(columns[: last.numel()], by_row[-1:]) for columns, by_row in keys])
    return total


def _lanes_of_rows(mixed: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Both lanes' sums over a block of mixed rows, with each lane's column keys and the keys of the block's rows."""
    return torch.stack([((mixed * columns).sum(1) * by_row).sum() for columns, by_row in keys])


class Landing:
    """The lanes of several tensors on their way to the host together: one copy and one event per device, queued on
    each device's current stream, so the thread that reads them (`get`) may be another and waits for nothing else."""

    def __init__(self, lanes_by_key: dict[str, torch.Tensor]) -> None:
        self._rows: dict[str, tuple[torch.Tensor, int]] = {}
        self._events: list[torch.cuda.Event] = []
        by_device: dict[torch.device, list[str]] = {}
        for key, held in lanes_by_key.items():
            by_device.setdefault(held.device, []).append(key)
        for device, keys in by_device.items():
            stacked = torch.stack([lanes_by_key[key] for key in keys])
            if device.type == "cuda":
                host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
                host.copy_(stacked, non_blocking=True)
                self._events.append(torch.cuda.current_stream(device).record_event())
                stacked = host
            self._rows.update((key, (stacked, i)) for i, key in enumerate(keys))

    def __contains__(self, key: str) -> bool:
        return key in self._rows

    def get(self, key: str) -> torch.Tensor:
        """Tensor `key`'s two lanes on the host, once they have landed."""
        for event in self._events:
            event.synchronize()
        self._events = []
        stacked, row = self._rows[key]
        return stacked[row]


def finish(lane_sums: torch.Tensor, nbytes: int) -> bytes:
    """The 16-byte digest from a tensor's lanes (this waits for them) and its byte count."""
    h = xxhash.xxh3_128(RULE.encode())
    h.update(nbytes.to_bytes(8, "little"))
    h.update(lane_sums.cpu().numpy().astype("<i8").tobytes())
    return h.digest()


def device_digest(t: torch.Tensor) -> bytes:
    """The rule's digest of `t`'s bytes, computed on `t`'s device."""
    return finish(lanes(t), t.nbytes)

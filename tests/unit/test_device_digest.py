"""The device rule (legato.state.device_digest): a plain-Python reference gives the same bytes, the digest does not
depend on how it is reduced, and a change anywhere in any dtype's bytes is caught.

The rule runs on CUDA tensors in a real run; here it runs on the CPU, where torch's int64 arithmetic wraps exactly
as on the device, so the reference is what every device must reproduce (tests/e2e/test_cuda.py checks a GPU against
the CPU on a GPU machine). The tables these tests walk are small; `CHUNK_ROWS` is lowered so that chunking shows too.
"""

from __future__ import annotations

import pytest
import torch
import xxhash

from legato.state import device_digest as rule
from legato.state.device_digest import ROW_WORDS, device_digest

MASK = (1 << 64) - 1
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
]


def _splitmix(x: int) -> int:
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 30
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _mix(w: int) -> int:
    x = w ^ (w >> 32)
    x = (x * rule.MIX) & MASK
    return x ^ (x >> 29)


def reference(t: torch.Tensor) -> bytes:
    """The rule written out over Python integers, word by word, from the module's docstring."""
    data = bytes(t.contiguous().view(-1).view(torch.uint8).tolist())
    padded = data + bytes(-len(data) % 8)
    lanes = []
    for lane in range(2):
        column_seed, row_seed = rule.SEEDS[2 * lane], rule.SEEDS[2 * lane + 1]
        total = 0
        for i in range(len(padded) // 8):
            w = int.from_bytes(padded[8 * i : 8 * i + 8], "little")
            column = _splitmix((i % ROW_WORDS + column_seed) & MASK) | 1
            row = _splitmix((i // ROW_WORDS + row_seed) & MASK) | 1
            total = (total + row * ((column * _mix(w)) & MASK)) & MASK
        lanes.append(total)
    h = xxhash.xxh3_128(rule.RULE.encode())
    h.update(len(data).to_bytes(8, "little"))
    h.update(b"".join(lane.to_bytes(8, "little") for lane in lanes))
    return h.digest()


def values(dtype: torch.dtype, count: int, seed: int = 0) -> torch.Tensor:
    raw = torch.randint(
        0, 256, (count * torch.empty(0, dtype=dtype).element_size(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype)


@pytest.mark.parametrize("count", [0, 1, 3, ROW_WORDS * 2, ROW_WORDS * 2 + 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float64])
def test_the_rule_is_its_plain_python_reference(dtype: torch.dtype, count: int) -> None:
    t = values(dtype, count * (8 // torch.empty(0, dtype=dtype).element_size()) + (count % 3))
    assert device_digest(t) == reference(t)


def test_the_digest_does_not_depend_on_chunks_threads_layout_or_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    t = values(torch.float32, ROW_WORDS * 2 * 5 + 7, seed=1)
    whole = device_digest(t)
    monkeypatch.setattr(rule, "CHUNK_ROWS", 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert device_digest(t) == whole
    finally:
        torch.set_num_threads(threads)
    square = t[: 100 * 100].view(100, 100)
    assert device_digest(square.t()) == device_digest(square.t().contiguous())
    unaligned = t[3:1003]  # starts 12 bytes into its storage: int64 words cannot start there
    assert device_digest(unaligned) == device_digest(unaligned.clone()) == reference(unaligned)
    buffer = bytearray(t[:1002].view(torch.uint8).numpy().tobytes())
    misplaced = torch.frombuffer(buffer, dtype=torch.uint8, offset=1, count=4001)  # its storage starts off a word
    assert device_digest(misplaced) == reference(misplaced)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_flipped_bit_anywhere_in_any_dtype_changes_the_digest(dtype: torch.dtype) -> None:
    """Planted fault: every single bit of a tensor whose bytes end mid-word, flipped one at a time."""
    size = torch.empty(0, dtype=dtype).element_size()
    t = values(dtype, (29 + size - 1) // size, seed=2)
    clean = device_digest(t)
    seen = {clean}
    for byte in range(t.nbytes):
        for bit in range(8):
            flipped = t.clone()
            flipped.view(torch.uint8)[byte] ^= 1 << bit
            seen.add(device_digest(flipped))
    assert len(seen) == 1 + 8 * t.nbytes, "two different single-bit flips, or a flip and the clean bytes, gave one digest"


def test_values_that_trade_places_change_the_digest() -> None:
    """Planted faults a plain sum of words cannot see: two words exchanged in a row, two whole rows exchanged."""
    t = values(torch.int64, ROW_WORDS * 3, seed=3)
    clean = device_digest(t)
    words = t.clone()
    words[[5, 9]] = words[[9, 5]]
    rows = t.clone().view(3, ROW_WORDS)
    rows[[0, 2]] = rows[[2, 0]]
    assert len({clean, device_digest(words), device_digest(rows.view(-1))}) == 3
    assert t.sum() == words.sum() == rows.sum()  # the planted faults keep the sum of the words


def test_the_byte_count_is_part_of_the_digest() -> None:
    """Zero bytes past the end are padding inside the rule, not data: a tensor and its zero-extended copy differ."""
    t = values(torch.uint8, 13, seed=4)
    assert device_digest(t) != device_digest(torch.cat([t, torch.zeros(3, dtype=torch.uint8)]))

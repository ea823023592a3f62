"""Block sums (legato.state.checksum): equal bytes agree however they are laid out or reduced; a one-ulp change does not.

They are how a rank shows that its live copy of a replicated tensor equals the
copy another rank wrote (unit/test_recipes.py, e2e/test_replicated_divergence.py).
"""

from __future__ import annotations

import pytest
import torch

from legato.state.checksum import BLOCKS, block_sums


def one_ulp_up(t: torch.Tensor, index: int) -> torch.Tensor:
    out = t.clone()
    flat = out.view(-1)
    flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf"), dtype=t.dtype))
    return out


def test_equal_bytes_agree_across_copies_layouts_and_thread_counts() -> None:
    t = torch.randn(300, 257, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = block_sums(t)
        torch.set_num_threads(2)
        two = block_sums(t.clone())
    finally:
        torch.set_num_threads(threads)
    assert one == two
    assert block_sums(t.t()) == block_sums(t.t().contiguous())
    unaligned = t.view(-1)[3 : 3 + 1000]  # starts 12 bytes into its storage: int64 words cannot start there
    assert block_sums(unaligned) == block_sums(unaligned.clone())


@pytest.mark.parametrize("index", [0, 1, 300 * 257 // 2, 300 * 257 - 2, 300 * 257 - 1])
def test_one_ulp_anywhere_changes_the_sums(index: int) -> None:
    """Planted fault: the smallest difference a diverging rank can hold, at the start, middle, end and in the tail."""
    t = torch.randn(300, 257, generator=torch.Generator().manual_seed(2))
    assert block_sums(one_ulp_up(t, index)) != block_sums(t)


def test_values_exchanged_between_blocks_change_the_sums() -> None:
    t = torch.arange(BLOCKS * 10, dtype=torch.float64)
    swapped = t.clone()
    swapped[[0, 10]] = swapped[[10, 0]]
    assert block_sums(swapped) != block_sums(t)


def test_dtype_and_shape_are_part_of_the_sums() -> None:
    t = torch.randn(4, 6)
    assert block_sums(t) != block_sums(t.view(torch.int32))
    assert block_sums(t) != block_sums(t.reshape(6, 4))


@pytest.mark.parametrize(
    "t",
    [
        torch.zeros(0),
        torch.tensor(2.5),
        torch.ones(3, dtype=torch.bool),
        torch.arange(1001, dtype=torch.int8),
        torch.randn(7, dtype=torch.bfloat16),
        torch.randn(5, dtype=torch.complex64),
    ],
)
def test_any_plain_tensor_has_sums_and_they_see_its_values(t: torch.Tensor) -> None:
    assert block_sums(t) == block_sums(t.clone())
    if t.numel():
        other = t.clone()
        other.view(-1).view(torch.uint8)[0] ^= 1
        assert block_sums(other) != block_sums(t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_a_tensor_on_the_gpu_sums_as_its_host_copy_does() -> None:
    """A rank sums its live GPU copy where the writer sums its staged host copy: the two must agree bit for bit."""
    t = torch.randn(1000, 77, generator=torch.Generator().manual_seed(3))
    assert block_sums(t.cuda()) == block_sums(t)
    assert block_sums(one_ulp_up(t, 5).cuda()) != block_sums(t)

"""The Triton bitmask pass (hifc.layers.triton_bitmask) against the torch code it replaces, in
Triton's interpreter on the CPU (TRITON_INTERPRET=1; tests/test_triton_interpreter.py runs it
in a child pytest) and compiled on CUDA (marked gpu)."""
import pytest
import torch

from hifc.layers import sampling_ops
from hifc.layers.triton_bitmask import triton_apply_token_bitmask
from tests.layers.triton_devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_triton_bitmask_matches_torch(device):
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 6, 4100  # not a multiple of the block nor of 32: a last, partial word
    logits = torch.randn(batch, vocab, generator=gen)
    bitmask = torch.randint(-2**31, 2**31, (3, -(-vocab // 32)), generator=gen,
                            dtype=torch.int64).to(torch.int32)
    bitmask[1] = -1  # every token allowed
    bitmask[2, :4] = 0  # the first 128 forbidden, and the sign bit of the rest random
    rows = torch.tensor([4, 0, 2])
    expected = logits.clone()
    sampling_ops.apply_token_bitmask(expected, rows, bitmask)  # CPU tensors: the torch code
    actual = logits.to(device)
    triton_apply_token_bitmask(actual, rows.to(device), bitmask.to(device))
    assert torch.equal(actual.cpu(), expected)
    assert torch.equal(expected[[1, 3, 5]], logits[[1, 3, 5]])  # rows without a grammar
    assert torch.equal(expected[0], logits[0])  # all allowed
    assert torch.isinf(expected[2, :128]).all() and expected[4].isinf().any()


def test_a_bitmask_too_narrow_for_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="does not cover"):
        triton_apply_token_bitmask(torch.zeros(2, 100), torch.tensor([0]),
                                   torch.zeros(1, 3, dtype=torch.int32))

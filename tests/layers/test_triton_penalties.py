"""The Triton penalty pass (hifc.layers.triton_penalties) against the torch code it replaces,
in Triton's interpreter on the CPU (TRITON_INTERPRET=1; tests/test_triton_interpreter.py runs
it in a child pytest) and compiled on CUDA (marked gpu)."""
import pytest
import torch

from hifc.layers import sampling_ops
from hifc.layers.triton_penalties import triton_apply_penalties
from tests.layers.triton_devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("subset", [False, True])
def test_triton_penalties_match_torch(device, subset):
    gen = torch.Generator().manual_seed(0)
    batch, vocab, pool = 6, 2500, 9  # vocab not a multiple of the block
    logits = torch.randn(batch, vocab, generator=gen) * 4
    counts = torch.randint(0, 4, (pool, vocab), generator=gen).float() \
        * (torch.rand(pool, vocab, generator=gen) < 0.01)
    seen = (counts > 0) | (torch.rand(pool, vocab, generator=gen) < 0.02)
    rows = torch.tensor([4, 0, 2]) if subset else None
    num = 3 if subset else batch
    pool_rows = torch.randperm(pool, generator=gen)[:num]
    presence = torch.rand(num, generator=gen) * 4 - 2
    frequency = torch.rand(num, generator=gen) * 4 - 2
    repetition = torch.rand(num, generator=gen) * 1.5 + 0.5
    expected = logits.clone()
    sampling_ops.apply_penalties(expected, rows, pool_rows, counts, seen, presence, frequency,
                                 repetition)  # CPU tensors: the torch code
    args = [t if t is None else t.to(device) for t in (rows, pool_rows, counts, seen, presence,
                                                        frequency, repetition)]
    actual = logits.to(device)
    triton_apply_penalties(actual, *args)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-6, atol=1e-6)
    if subset:  # rows without penalties are untouched
        untouched = [1, 3, 5]
        assert torch.equal(actual.cpu()[untouched], logits[untouched])

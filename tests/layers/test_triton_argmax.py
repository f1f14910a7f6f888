"""The Triton greedy argmax (hifc.layers.triton_argmax) against torch.argmax, in Triton's
interpreter on the CPU (TRITON_INTERPRET=1; tests/test_triton_interpreter.py runs it in a child
pytest) and compiled on CUDA (marked gpu)."""
import pytest
import torch

from hifc.layers import sampling_ops, triton_argmax
from tests.layers.triton_devices import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [1, 4095, 4096, 10000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_maximum_of_each_row_as_torch(device, vocab, dtype):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(7, vocab, generator=gen)
    logits[1] = 0.5  # every column ties: the first
    logits[2] = float("-inf")  # nothing allowed: column 0, as torch
    if vocab > 4096:
        logits[3, 4097] = logits[3, 9000] = 9.0  # ties in two chunks: the earlier chunk's
        logits[4, 5000] = logits[4, 4999] = 9.0  # ties in one chunk
    logits[5, vocab // 2] = float("nan")  # NaN wins, as in torch
    logits[6, vocab - 1] = 50.0  # the last column
    logits = logits.to(device, dtype)  # bfloat16 rounds many values into ties: the first
    expected = logits.argmax(dim=-1)
    got = triton_argmax.argmax_rows(logits)
    assert got.dtype == torch.int64 and got.tolist() == expected.tolist()
    # a view of the first rows of a wider buffer, as a CUDA graph's output is read
    wide = torch.randn(9, vocab, generator=gen).to(device, dtype)
    assert triton_argmax.argmax_rows(wide[:3]).tolist() == wide[:3].argmax(-1).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows_and_bad_input(device):
    assert triton_argmax.argmax_rows(torch.zeros(0, 50, device=device)).shape == (0,)
    with pytest.raises(ValueError, match="float32"):
        triton_argmax.argmax_rows(torch.zeros(2, 50, device=device, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous rows"):
        triton_argmax.argmax_rows(torch.zeros(50, 2, device=device).T)


def test_the_sampler_takes_torch_argmax_off_cuda():
    logits = torch.tensor([[0.0, 3.0, 3.0], [1.0, -1.0, 0.0]])
    assert not triton_argmax.usable(logits)
    assert sampling_ops.argmax(logits).tolist() == [1, 0]

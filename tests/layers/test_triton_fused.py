"""Fused Triton kernels (hifc.layers.triton_fused) against the torch code they replace.

Each case runs twice: on the CPU through Triton's interpreter (with TRITON_INTERPRET=1, as the other
Triton tests; tests/conftest.py patches the interpreter so that it rounds float32 -> bfloat16 as
the GPU does), and compiled on CUDA (marked gpu). Without TRITON_INTERPRET=1 the CPU cases run in
a child pytest that sets it (tests/test_triton_interpreter.py), so the default suite covers the
kernels.

What must match:
- rotary: bit for bit (each product rounded to the dtype, then the sum or difference).
- silu_and_mul: bit for bit on CUDA (CUDA's expf and IEEE division, as torch's kernel). In the
  interpreter exp is numpy's, not torch's CPU one (Sleef): float32 then differs by a few ulps
  (4 seen) and fp16/bf16 rarely flips silu's last bit, which the multiply by up can make 2 ulps.
- rms_norm: the residual sum bit for bit. The normed output sums its squares in another order than
  torch's mean (and rsqrt may differ by an ulp), so its float32 scale can be off by a few ulps:
  float32 outputs by a few ulps (4 seen; 8 allowed), and in fp16/bf16 an element's last bit
  flips rarely, which the weight multiply can make 2 ulps (at most 2, in under 1% of elements).
"""
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from hifc.layers import triton_fused
from hifc.layers.activation import silu_and_mul
from hifc.layers.norm import RMSNorm
from hifc.layers.rotary import RotaryEmbedding
from tests.layers.triton_devices import DEVICES, HAS_TRITON, INTERPRET

HAS_CUDA = torch.cuda.is_available()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@contextmanager
def torch_path():
    """Run the layers' torch code even on CUDA: the reference."""
    with mock.patch.object(triton_fused, "usable", return_value=False):
        yield


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per element, how many representable values of the (shared) dtype lie between a and b."""
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = {torch.float32: torch.int32, torch.float16: torch.int16,
            torch.bfloat16: torch.int16}[a.dtype]
    sign = 1 << (8 * a.element_size() - 1)

    def ordered(x):  # integers in the floats' order; +0 and -0 both 0
        i = x.contiguous().view(bits).long()
        return torch.where(i < 0, -(i + sign), i)

    return (ordered(a) - ordered(b)).abs()


def assert_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    ulps = ulp_distance(actual, expected)
    assert torch.equal(actual, expected), (f"{int((ulps > 0).sum())} of {ulps.numel()} elements "
                                           f"differ, by up to {int(ulps.max())} ulps")


def assert_ulps(actual, expected, max_ulps, max_fraction=1.0):
    ulps = ulp_distance(actual, expected)
    fraction = (ulps > 0).float().mean().item()
    assert int(ulps.max()) <= max_ulps and fraction <= max_fraction, (
        f"{fraction:.2%} of elements differ, by up to {int(ulps.max())} ulps")


def randn(*shape, dtype, device, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True], ids=["x", "x+residual"])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 64), (7, 576), (5, 4096), (3, 8192)])
def test_rms_norm(device, dtype, with_residual, num_tokens, hidden):
    norm = RMSNorm(hidden, 1e-5, dtype, torch.device(device))
    norm.weight.copy_(1 + randn(hidden, dtype=dtype, device=device, seed=1, scale=0.3))
    x = randn(num_tokens, hidden, dtype=dtype, device=device, seed=2, scale=4)
    residual = (randn(num_tokens, hidden, dtype=dtype, device=device, seed=3)
                if with_residual else None)
    with torch_path():
        expected_out, expected_sum = norm(x, residual)
    out, summed = triton_fused.rms_norm(x, norm.weight, norm.eps, residual)
    assert_equal(summed, expected_sum)
    if residual is None:
        assert summed is x
    if dtype == torch.float32:
        assert_ulps(out, expected_out, max_ulps=8)
    else:
        assert_ulps(out, expected_out, max_ulps=2, max_fraction=0.01)
    if device == "cuda":  # the module dispatches to the kernel
        assert torch.equal(norm(x, residual)[0], out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_unit_offset_over_heads(device, dtype):
    # Gemma's (1 + weight) on [T, H, D] rows (per-head q/k norms normalize the last dim only).
    norm = RMSNorm(32, 1e-6, dtype, torch.device(device), unit_offset=True)
    assert torch.equal(norm.weight, torch.zeros_like(norm.weight))  # identity weight
    norm.weight.copy_(randn(32, dtype=dtype, device=device, seed=1, scale=0.3))
    x = randn(5, 4, 32, dtype=dtype, device=device, seed=2, scale=4)
    with torch_path():
        expected, _ = norm(x)
    out, _ = triton_fused.rms_norm(x, norm.weight, norm.eps, unit_offset=True)
    assert out.shape == x.shape
    if dtype == torch.float32:
        assert_ulps(out, expected, max_ulps=8)
    else:
        assert_ulps(out, expected, max_ulps=2, max_fraction=0.02)
    plain, _ = triton_fused.rms_norm(x, norm.weight, norm.eps)
    assert not torch.allclose(plain.float(), out.float())  # the offset changes the result


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # interpreter
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,intermediate", [(1, 64), (7, 1536), (4, 2500), (3, 14336)])
def test_silu_and_mul(device, dtype, num_tokens, intermediate):
    gate_up = randn(num_tokens, 2 * intermediate, dtype=dtype, device=device, seed=4, scale=4)
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 100.0, -100.0])  # exp overflows/underflows
    with torch_path():
        expected = silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(expected, F.silu(gate) * up)
    out = triton_fused.silu_and_mul(gate_up)
    if device == "cuda":
        assert_equal(out, expected)
        assert torch.equal(silu_and_mul(gate_up), out)
    elif dtype == torch.float32:
        assert_ulps(out, expected, max_ulps=8)
    else:
        assert_ulps(out, expected, max_ulps=2, max_fraction=0.001)


ROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_tokens,num_q_heads,num_kv_heads,head_dim,rope_scaling", [
    (7, 9, 3, 64, None),  # SmolLM2-135M
    (5, 32, 8, 128, ROPE_LLAMA3),  # Llama 3.1 8B
    (1, 4, 4, 128, None),  # no GQA
    (3, 6, 2, 96, None),  # head_dim / 2 not a power of 2
], ids=["smollm2", "llama3-8b", "mha", "d96"])
def test_rotary(device, dtype, num_tokens, num_q_heads, num_kv_heads, head_dim, rope_scaling):
    max_positions = 4096
    rotary = RotaryEmbedding(head_dim, max_positions, 500000.0, rope_scaling, dtype,
                             torch.device(device))
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    qkv = randn(num_tokens, q_size + 2 * kv_size, dtype=dtype, device=device, seed=5, scale=2)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)  # strided views, as in LlamaAttention
    q = q.view(num_tokens, num_q_heads, head_dim)
    k = k.view(num_tokens, num_kv_heads, head_dim)
    gen = torch.Generator().manual_seed(6)
    positions = torch.randint(0, max_positions, (num_tokens,), generator=gen).to(device)
    positions[-1] = max_positions - 1
    qkv_before = qkv.clone()
    with torch_path():
        expected_q, expected_k = rotary(positions, q, k)
    out_q, out_k = triton_fused.rotary(positions, q, k, rotary.cos_cache, rotary.sin_cache)
    assert_equal(out_q, expected_q)
    assert_equal(out_k, expected_k)
    assert torch.equal(qkv, qkv_before)  # inputs untouched (v is read later)
    out_q32, out_k32 = triton_fused.rotary(positions.int(), q, k, rotary.cos_cache,
                                           rotary.sin_cache)
    assert torch.equal(out_q32, out_q) and torch.equal(out_k32, out_k)
    if device == "cuda":
        q_dispatched, k_dispatched = rotary(positions, q, k)
        assert torch.equal(q_dispatched, out_q) and torch.equal(k_dispatched, out_k)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA) or INTERPRET,
                    reason="needs CUDA and triton, kernels compiled (no TRITON_INTERPRET)")
def test_kernels_replay_from_a_cuda_graph():
    """Captured once, replayed on new inputs written into the same buffers: same as eager."""
    dtype, device = torch.bfloat16, "cuda"
    norm = RMSNorm(4096, 1e-5, dtype, torch.device(device))
    rotary = RotaryEmbedding(128, 4096, 500000.0, ROPE_LLAMA3, dtype, torch.device(device))
    x = randn(8, 4096, dtype=dtype, device=device, seed=7)
    residual = randn(8, 4096, dtype=dtype, device=device, seed=8)
    gate_up = randn(8, 2 * 14336, dtype=dtype, device=device, seed=9)
    qkv = randn(8, 48 * 128, dtype=dtype, device=device, seed=10)
    positions = torch.arange(8, device=device)

    def step():
        q, k, _ = qkv.split([4096, 1024, 1024], dim=-1)
        return (*norm(x, residual), silu_and_mul(gate_up),
                *rotary(positions, q.view(8, 32, 128), k.view(8, 8, 128)))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compiles the kernels outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            outputs = step()
    torch.cuda.current_stream().wait_stream(stream)
    for i, buffer in enumerate((x, residual, gate_up, qkv)):
        buffer.copy_(randn(*buffer.shape, dtype=dtype, device=device, seed=20 + i))
    positions.copy_(torch.tensor([4095, 0, 17, 17, 2048, 3, 1000, 5], device=device))
    graph.replay()
    torch.cuda.synchronize()
    for replayed, eager in zip(outputs, step()):
        assert torch.equal(replayed, eager)

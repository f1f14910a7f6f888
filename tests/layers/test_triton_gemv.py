"""The Triton GEMV for one-row projections against F.linear in float32, and with its input
computed in the kernel (RMSNorm, SiLU-and-mul) against the two-launch path.

Each case runs on the CPU through Triton's interpreter (with TRITON_INTERPRET=1; the default suite
runs this file's interpreter cases in a child pytest, tests/test_triton_interpreter.py) and
compiled on CUDA (marked gpu). The kernel's PTX for Hopper is checked on any machine.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from hifc.layers import linear as linear_module
from hifc.layers import triton_fused, triton_gemv
from hifc.layers.activation import GATED_ACTIVATIONS
from hifc.layers.linear import MergedColumnLinear, QKVLinear, RowLinear, project_then_norm
from hifc.layers.norm import RMSNorm
from hifc.layers.tensor_parallel import TPShard
from tests.layers.triton_devices import DEVICES, HAS_TRITON, INTERPRET


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,k,bias", [(40, 1024, False), (6144, 4096, False), (72, 1536, True)])
def test_gemv_matches_float32_linear(device, dtype, n, k, bias):
    # N not a multiple of the program's rows (40, 72) masks the last program's rows.
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    out = triton_gemv.gemv(x, w, b)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert out.shape == (1, n) and out.dtype == dtype
    # one rounding of the float32 sum to the 16-bit dtype
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,n,k,bias,swap", [
    (2, 40, 1024, False, None), (5, 72, 1536, True, None), (16, 6144, 4096, False, None),
    (24, 72, 1024, True, None), (32, 4096, 1024, False, None), (3, 6144, 1024, True, None),
    (32, 10240, 512, False, None), (5, 72, 1536, True, True), (29, 136, 512, True, True),
    (4, 6144, 1024, False, False)])
def test_rows_kernel_matches_float32_linear(device, dtype, m, n, k, bias, swap):
    # swap None: as rows_config gives (6144 and 10240 features swap the product's sides);
    # forced either way on masked row and feature tiles
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter gets bf16 tl.dot wrong")
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    out = triton_gemv.gemm_rows(x, w, b, swap=swap)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert out.shape == (m, n) and out.dtype == dtype
    tol = _tol(dtype)
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def _tol(dtype):
    """One rounding of a float32 result to the 16-bit dtype."""
    return 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10


def _assert_projects_normed(out, normed, w, b, device, dtype):
    """A fused norm-and-projection's output against the projection of the separately normed
    input (the GEMV on CUDA, float32 F.linear on the CPU)."""
    two_launches = triton_gemv.gemv(normed, w, b) if device == "cuda" else F.linear(
        normed.float(), w.float(), None if b is None else b.float())
    tol = _tol(dtype)
    assert out.shape == (1, w.shape[0]) and out.dtype == dtype
    # the same input up to an element's last bit (the squares summed in another order)
    assert torch.allclose(out.float(), two_launches.float(), rtol=2 * tol,
                          atol=2 * tol * two_launches.abs().max().item())


def test_wide_weights_take_128_row_tiles_unless_their_last_wave_leaves_more_sms_idle():
    def rows(n, sms=None):
        config = triton_gemv.rows_config(n, 32, sms)
        assert config["swap"]
        return config["block_n"]

    assert rows(6144, 132) == rows(7168, 132) == 64  # 8B and 32B QKV: below SWAP_WIDE_N
    # 8B gate-up: 224 programs fill 85% of two waves on 132 SMs, as 448 of 64 rows do
    assert rows(28672, 132) == 128
    # 32B gate-up: 432 programs fill 82% of four waves, 864 of 64 rows 94% of seven
    assert rows(55296, 132) == 64
    assert rows(55296, 114) == rows(55296) == 128  # 95% either way; no SM count given


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("residual,unit_offset,bias", [(True, False, False), (False, False, True),
                                                       (True, True, False)])
def test_gemv_rms_norm_matches_norm_then_linear(device, dtype, residual, unit_offset, bias):
    n, k = 72, 1536  # K a multiple of BLOCK_K but not a power of two; rows masked
    gen = torch.Generator().manual_seed(k + residual + 2 * unit_offset)
    x = (3 * torch.randn(1, k, generator=gen)).to(dtype).to(device)
    r = torch.randn(1, k, generator=gen).to(dtype).to(device) if residual else None
    norm = RMSNorm(k, 1e-5, dtype, torch.device(device), unit_offset=unit_offset)
    norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    out, summed = triton_gemv.gemv_rms_norm(x, r, norm.weight, norm.eps, unit_offset, w, b)
    # the residual sum bit for bit, as rms_norm returns it
    if residual:
        assert torch.equal(summed, (x.float() + r.float()).to(dtype))
    else:
        assert summed is x
    normed, _ = norm(x, r)  # the two-launch path (the fused kernel, or torch on the CPU)
    _assert_projects_normed(out, normed, w, b, device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_silu_mul_matches_silu_then_linear(device, dtype, bias):
    n, k = 40, 1024
    gen = torch.Generator().manual_seed(n + k + bias)
    gate_up = (3 * torch.randn(1, 2 * k, generator=gen)).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    out = triton_gemv.gemv_silu_mul(gate_up, w, b)
    x = GATED_ACTIVATIONS["silu"](gate_up)  # rounded as torch rounds each step
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    tol = _tol(dtype)
    assert out.shape == (1, n) and out.dtype == dtype
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    if device == "cuda":  # silu_and_mul's input up to a last bit, then the GEMV
        assert torch.allclose(out, triton_gemv.gemv(x, w, b), rtol=tol, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,unit_offset,bias", [(1536, False, False), (1536, True, True),
                                                (72, False, True)])
def test_gemv_add_sumsq_then_norm_sumsq_match_the_norm_between(device, dtype, n, unit_offset,
                                                                bias):
    # An output projection adding the residual and summing squares, then a projection
    # normalizing its input from those sums, against the product, rms_norm and the projection.
    # N = 72 masks the last program's features (and is not a K the second GEMV takes).
    k, m = 1024, 40
    gen = torch.Generator().manual_seed(n + unit_offset + 2 * bias)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    residual = (3 * torch.randn(1, n, generator=gen)).to(dtype).to(device)
    summed, sumsq = triton_gemv.gemv_add_sumsq(x, residual, w, b)
    # the GEMV's own product, plus the residual as rms_norm adds it, bit for bit
    expected = (triton_gemv.gemv(x, w, b).float() + residual.float()).to(dtype)
    assert summed.shape == (1, n) and summed.dtype == dtype
    assert torch.equal(summed, expected)
    assert sumsq.shape == (-(-n // triton_gemv.BLOCK_N),) and sumsq.dtype == torch.float32
    assert torch.allclose(sumsq.sum(), summed.float().pow(2).sum(), rtol=1e-5)
    if n % triton_gemv.BLOCK_K:
        return
    norm = RMSNorm(n, 1e-5, dtype, torch.device(device), unit_offset=unit_offset)
    norm.weight.copy_(torch.rand(n, generator=gen) + 0.5)
    w2 = (torch.randn(m, n, generator=gen) / n ** 0.5).to(dtype).to(device)
    b2 = torch.randn(m, generator=gen).to(dtype).to(device) if bias else None
    out = triton_gemv.gemv_norm_sumsq(summed, sumsq, norm.weight, norm.eps, unit_offset, w2, b2)
    normed, _ = norm(summed)
    _assert_projects_normed(out, normed, w2, b2, device, dtype)


def test_usable_only_for_one_16_bit_row_on_cuda():
    w = torch.empty(64, 1024, dtype=torch.bfloat16)
    x = torch.empty(1, 1024, dtype=torch.bfloat16)
    assert not triton_gemv.usable(x, w)  # CPU tensors
    meta = torch.device("meta")
    cuda_like = {"is_cuda": True}

    class Fake:
        """Tensor attributes as a CUDA tensor of the given shape and dtype shows them."""

        def __init__(self, t):
            self.t = t

        def __getattr__(self, name):
            return cuda_like.get(name, getattr(self.t, name))

    def ok(m, k, dtype=torch.bfloat16, w_dtype=None):
        xs = Fake(torch.empty(m, k, dtype=dtype, device=meta))
        ws = Fake(torch.empty(64, k, dtype=w_dtype or dtype, device=meta))
        return triton_gemv.usable(xs, ws)

    if not HAS_TRITON:
        assert not ok(1, 1024)
        return
    assert ok(1, 1024) and ok(1, 4096, torch.float16)
    assert not ok(2, 1024)  # more than one row: cuBLAS
    assert not ok(1, 1000)  # K not a multiple of BLOCK_K
    assert not ok(1, 1024, torch.float32)
    assert not ok(1, 1024, torch.bfloat16, torch.float16)

    def ok_rows(m, k=1024):
        return triton_gemv.usable_rows(Fake(torch.empty(m, k, dtype=torch.bfloat16, device=meta)),
                                       Fake(torch.empty(64, k, dtype=torch.bfloat16,
                                                        device=meta)))

    assert ok_rows(2) and ok_rows(triton_gemv.MAX_ROWS)
    assert not ok_rows(1)  # one row: the GEMV
    assert not ok_rows(triton_gemv.MAX_ROWS + 1)  # more: cuBLASLt ...
    assert not ok_rows(triton_gemv.FULL_TILE_ROWS - 1)
    assert ok_rows(triton_gemv.FULL_TILE_ROWS) and ok_rows(32)  # ... but a 32-row tile
    assert not ok_rows(33)
    assert [m for m in range(40) if triton_gemv.takes_rows(m)] == [*range(2, 17), *range(25, 33)]
    assert not ok_rows(4, 1000)

    def ok_fused(k, residual=True, norm_dtype=torch.bfloat16, gate_up_width=None):
        def t(*shape, dtype=torch.bfloat16):
            return Fake(torch.empty(*shape, dtype=dtype, device=meta))
        w = t(64, k)
        if gate_up_width is not None:
            return triton_gemv.usable_silu_mul(t(1, gate_up_width), w)
        return triton_gemv.usable_rms_norm(t(1, k), t(1, k) if residual else None,
                                           t(k, dtype=norm_dtype), w)

    assert ok_fused(1024) and ok_fused(1024, residual=False)
    assert not ok_fused(1000)
    assert not ok_fused(1024, norm_dtype=torch.float32)  # rms_norm wants one dtype
    assert ok_fused(1024, gate_up_width=2048)
    assert not ok_fused(1024, gate_up_width=1024)  # gate_up is twice the weight's K


def test_row_variants_name_one_row_count_per_compiled_variant():
    # the 16-row tile for 2..16 rows, the 32-row tile for 25..32; M a multiple of 16 or not
    assert triton_gemv.row_variants(256) == [2, 16, 25, 32]
    assert triton_gemv.row_variants(31) == [2, 16, 25]
    assert triton_gemv.row_variants(24) == triton_gemv.row_variants(16) == [2, 16]
    assert triton_gemv.row_variants(15) == [2]
    assert triton_gemv.row_variants(1) == []


def test_row_linear_takes_the_gemv_for_one_row_and_the_rows_kernel_for_a_few(monkeypatch):
    # Linear layers route through linear(): a usable row goes to the GEMV, a few usable rows to
    # the small-M kernel, others to F.linear.
    calls = []
    monkeypatch.setattr(linear_module.triton_gemv, "usable", lambda x, w: x.shape[0] == 1)
    monkeypatch.setattr(linear_module.triton_gemv, "usable_rows",
                        lambda x, w: 2 <= x.shape[0] <= 3)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv",
                        lambda x, w, b: calls.append(("gemv", x.shape[0])) or F.linear(x, w, b))
    monkeypatch.setattr(linear_module.triton_gemv, "gemm_rows",
                        lambda x, w, b: calls.append(("rows", x.shape[0])) or F.linear(x, w, b))
    layer = RowLinear(32, 8, True, torch.float32, torch.device("cpu"))
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(4, 32)
    for rows in (1, 3, 4):
        assert torch.equal(layer(x[:rows]), F.linear(x[:rows], layer.weight, layer.bias))
    assert calls == [("gemv", 1), ("rows", 3)]


@pytest.mark.parametrize("layer_class", [MergedColumnLinear, QKVLinear])
def test_column_layers_take_the_norm_into_the_gemv_for_one_row(monkeypatch, layer_class):
    fused = []

    def gemv_rms_norm(x, residual, norm_weight, eps, unit_offset, w, b):
        normed, summed = norm(x, residual)  # stands in for the kernel
        fused.append(x.shape)
        return F.linear(normed, w, b), summed

    monkeypatch.setattr(linear_module.triton_gemv, "usable_rms_norm",
                        lambda x, r, nw, w: x.shape[0] == 1)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv_rms_norm", gemv_rms_norm)
    cpu = torch.device("cpu")
    if layer_class is QKVLinear:
        layer = QKVLinear(16, 2, 1, 4, True, torch.float32, cpu)  # q 8, k 4, v 4
    else:
        layer = MergedColumnLinear(16, [8, 8], True, torch.float32, cpu)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    norm = RMSNorm(16, 1e-6, torch.float32, cpu)
    torch.nn.init.normal_(norm.weight)
    x, r = torch.randn(3, 16), torch.randn(3, 16)
    for rows in (1, 3):  # one row fused, three through the norm and the layer
        out, summed = layer.forward_normed(norm, x[:rows], r[:rows])
        normed, expected_sum = norm(x[:rows], r[:rows])
        expected = layer(normed)
        assert torch.equal(summed, expected_sum)
        if layer_class is QKVLinear:  # q, k, v as forward splits them
            assert [t.shape[1] for t in out] == [8, 4, 4]
            assert all(torch.allclose(a, e) for a, e in zip(out, expected))
        else:
            assert torch.allclose(out, expected)
    assert fused == [torch.Size([1, 16])]


class TwoRanks(TPShard):
    """Rank 0 of two whose all-reduce doubles its partial product (both ranks' alike)."""

    def all_reduce(self, x):
        return 2 * x


def test_project_then_norm_takes_the_norm_into_both_gemvs_for_one_row(monkeypatch):
    fused = []

    def add_sumsq(x, residual, w, b):
        summed = F.linear(x, w, b) + residual
        fused.append("add")
        return summed, summed.pow(2).sum().reshape(1)

    def norm_sumsq(summed, sumsq, nw, eps, unit_offset, w, b):
        assert torch.allclose(sumsq.sum(), summed.pow(2).sum())
        fused.append("norm")
        return F.linear(norm(summed)[0], w, b)

    monkeypatch.setattr(linear_module.triton_gemv, "usable_add_sumsq",
                        lambda x, r, w: x.shape[0] == 1)
    monkeypatch.setattr(linear_module.triton_gemv, "usable_norm_sumsq", lambda s, nw, w: True)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv_add_sumsq", add_sumsq)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv_norm_sumsq", norm_sumsq)
    cpu = torch.device("cpu")
    row = RowLinear(8, 16, True, torch.float32, cpu)
    column = QKVLinear(16, 2, 1, 4, True, torch.float32, cpu)  # q 8, k 4, v 4
    norm = RMSNorm(16, 1e-6, torch.float32, cpu)
    for p in (row.weight, row.bias, column.weight, column.bias, norm.weight):
        torch.nn.init.normal_(p)
    x, r = torch.randn(3, 8), torch.randn(3, 16)
    for rows in (1, 3):  # one row through both GEMVs, three through the layers and the norm
        out, summed = project_then_norm(row, x[:rows], r[:rows], norm, column)
        normed, expected_sum = norm(row(x[:rows]), r[:rows])
        assert torch.allclose(summed, expected_sum)
        assert [t.shape[1] for t in out] == [8, 4, 4]  # split as QKVLinear splits
        assert all(torch.allclose(a, e, atol=1e-5) for a, e in zip(out, column(normed)))
    assert fused == ["add", "norm"]

    # a row layer over two ranks sums its partial products first: the norm runs on its own
    sharded = RowLinear(16, 16, True, torch.float32, cpu, TwoRanks(0, 2))
    torch.nn.init.normal_(sharded.weight)
    torch.nn.init.normal_(sharded.bias)
    out, summed = project_then_norm(sharded, x[:1], r[:1], norm, column)
    assert torch.allclose(summed, sharded(x[:1]) + r[:1])
    assert fused == ["add", "norm"]


def test_row_layer_takes_silu_into_the_gemv_for_one_row(monkeypatch):
    fused = []
    monkeypatch.setattr(linear_module.triton_gemv, "usable_silu_mul",
                        lambda g, w: g.shape[0] == 1)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv_silu_mul",
                        lambda g, w, b=None: fused.append(g.shape)
                        or F.linear(GATED_ACTIVATIONS["silu"](g), w, b))
    layer = RowLinear(8, 4, True, torch.float32, torch.device("cpu"))
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    gate_up = torch.randn(3, 16)
    for act in ("silu", "gelu_pytorch_tanh"):  # only SiLU is fused
        for rows in (1, 3):
            expected = layer(GATED_ACTIVATIONS[act](gate_up[:rows]))
            assert torch.allclose(layer.forward_gated(gate_up[:rows], act), expected)
    assert fused == [torch.Size([1, 16])]

    # a rank of two: the fused partial product is summed over the ranks, the bias added once
    sharded = RowLinear(16, 4, True, torch.float32, torch.device("cpu"), TwoRanks(0, 2))
    sharded.weight.copy_(layer.weight)
    sharded.bias.copy_(layer.bias)
    out = sharded.forward_gated(gate_up[:1], "silu")
    partial = F.linear(GATED_ACTIVATIONS["silu"](gate_up[:1]), layer.weight)
    assert torch.allclose(out, 2 * partial + layer.bias)
    assert fused == [torch.Size([1, 16])] * 2


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_only_the_o_and_gate_up_gemvs_launch_with_pdl(monkeypatch):
    # Where PDL is on, the GEMVs after the attention (O, adding the residual) and after the O
    # projection (gate-up, normalizing from its sums) launch with it; the QKV and down GEMVs
    # and a plain one release their dependents without waiting.
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: launches.append(options)

    monkeypatch.setattr(triton_gemv, "_gemv_kernel", Recorder())
    monkeypatch.setattr(triton_gemv.triton_pdl, "enabled", lambda device: True)
    x, w = torch.zeros(1, 512), torch.zeros(64, 512)
    triton_gemv.gemv(x, w)
    triton_gemv.gemv_rms_norm(x, x, torch.ones(512), 1e-6, False, w)
    triton_gemv.gemv_silu_mul(torch.zeros(1, 1024), w)
    summed, sumsq = triton_gemv.gemv_add_sumsq(x, torch.zeros(1, 64), w)
    triton_gemv.gemv_norm_sumsq(x, sumsq, torch.ones(512), 1e-6, False, w)
    assert [(o["PDL"], o.get("launch_pdl", False), o["RELEASE"]) for o in launches] == [
        (False, False, True)] * 3 + [(True, True, True)] * 2
    monkeypatch.setattr(triton_gemv.triton_pdl, "enabled", lambda device: False)
    launches.clear()
    triton_gemv.gemv_add_sumsq(x, torch.zeros(1, 64), w)
    assert launches[0]["PDL"] is False and "launch_pdl" not in launches[0]


@pytest.mark.skipif(not HAS_TRITON or INTERPRET, reason="needs triton, kernels compiled")
def test_gemv_compiles_to_wide_loads_for_hopper():
    from tests.layers.test_triton_compile_fp8 import compile_ptx
    from tests.layers.test_triton_pdl import RELEASE, WAIT, assert_prefetch_then_wait

    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16",
                 "N": "i32", "stride_wn": "i32", "residual_ptr": "*bf16",
                 "norm_weight_ptr": "*bf16", "summed_ptr": "*bf16", "sumsq_ptr": "*fp32",
                 "num_partials": "i32", "eps": "fp32"}
    # (prologue, add_sumsq, launched with PDL as gemv_add_sumsq and gemv_norm_sumsq launch)
    cases = ((triton_gemv._PLAIN, False, False), (triton_gemv._RMS_NORM, False, False),
             (triton_gemv._SILU_MUL, False, False), (triton_gemv._PLAIN, True, True),
             (triton_gemv._NORM_SUMSQ, False, True))
    for (prologue, add_sumsq, pdl), release in itertools.product(cases, (False, True)):
        ptx = compile_ptx(triton_gemv._gemv_kernel, signature,
                          dict(K_STEPS=8, BLOCK_N=triton_gemv.BLOCK_N,
                               BLOCK_K=triton_gemv.BLOCK_K, STAGES=triton_gemv.NUM_STAGES,
                               HAS_BIAS=False, PROLOGUE=prologue, HAS_RESIDUAL=True,
                               UNIT_OFFSET=False, NORM_BLOCK=4096, ADD_SUMSQ=add_sumsq,
                               RELEASE=release, PDL=pdl),
                          triton_gemv.NUM_WARPS)
        assert "cp.async" in ptx  # weight slices loaded ahead of their use (pipelined)
        assert "mma" not in ptx  # no tensor cores for one row
        first_load = min(ptx.index(load) for load in ("ld.global", "cp.async") if load in ptx)
        if pdl:  # it releases, then waits for the kernel before it, before its first load
            assert ptx.count(WAIT) == 1 and ptx.count(RELEASE) == 1
            assert ptx.index(RELEASE) < ptx.index(WAIT) < first_load
        elif release:  # its dependents released before its first load, and no wait
            assert WAIT not in ptx and ptx.count(RELEASE) == 1
            assert ptx.index(RELEASE) < first_load
        else:
            assert_prefetch_then_wait(ptx, False)  # launched without PDL
    for (n, m), pdl in itertools.product(((4096, 2), (6144, 16), (4096, 32), (6144, 32),
                                          (28672, 4), (28672, 32)),
                                         (False, True)):  # each rows_config gives
        config = triton_gemv.rows_config(n, m)
        ptx = compile_ptx(triton_gemv._rows_kernel,
                          {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16",
                           "out_ptr": "*bf16", "M": "i32", "N": "i32", "stride_xm": "i32",
                           "stride_wn": "i32", "stride_om": "i32"},
                          dict(K_STEPS=8, BLOCK_M=triton_gemv.rows_block_m(m),
                               BLOCK_N=config["block_n"], BLOCK_K=config["block_k"],
                               STAGES=config["stages"], HAS_BIAS=False,
                               SWAP=config["swap"], PDL=pdl, PREFETCH_LINES=16),
                          config["warps"])
        assert "cp.async" in ptx  # pipelined
        # on tensor cores: wgmma where the weight tile is the M side (wide weights)
        assert config["swap"] == (n >= triton_gemv.SWAP_MIN_N)
        assert ("wgmma.mma_async" in ptx) == config["swap"]
        assert ("mma.sync" in ptx) != config["swap"]
        assert_prefetch_then_wait(ptx, pdl, releasing_first=True)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()) or INTERPRET,
                    reason="needs triton and a CUDA GPU")
@pytest.mark.parametrize("attention_bias", [False, True])
@torch.inference_mode()
def test_one_token_through_the_model_with_norm_and_silu_in_the_gemvs(monkeypatch, attention_bias):
    # A decoder whose projections the GEMV takes (K = 512, 1536): one token through the fused
    # launches against the two-launch path (the fused kernels switched off), attention stood in
    # for by a function of q, k, v.
    from hifc.models.config import ModelArchConfig
    from hifc.models.llama import LlamaForCausalLM

    arch = ModelArchConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=512,
                           intermediate_size=1536, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=128, attention_bias=attention_bias,
                           max_position_embeddings=64)
    model = LlamaForCausalLM(arch, torch.bfloat16, torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(int(attention_bias))
    for name, p in model.named_parameters():
        if "norm" in name:
            p.uniform_(0.5, 1.5, generator=gen)
        else:
            p.normal_(0.0, 0.05, generator=gen)

    def attn(layer_idx, q, k, v, rope):
        q, k = rope.rotary(rope.positions, q, k)
        return q + (k * v).repeat_interleave(2, dim=1)  # [T, Hq, D]

    calls = {"gemv_rms_norm": 0, "gemv_silu_mul": 0, "gemv_add_sumsq": 0, "gemv_norm_sumsq": 0}
    for name in calls:
        def counted(*args, _name=name, _fn=getattr(triton_gemv, name)):
            calls[_name] += 1
            return _fn(*args)
        monkeypatch.setattr(triton_gemv, name, counted)
    ids = torch.tensor([7], device="cuda")
    positions = torch.tensor([5], device="cuda")
    fused = model(ids, positions, attn)
    # per layer: the input norm, the residual add and norm after attention, and SiLU
    assert calls == dict.fromkeys(calls, 2)
    for name in ("usable_rms_norm", "usable_silu_mul", "usable_add_sumsq"):
        monkeypatch.setattr(triton_gemv, name, lambda *a: False)
    two_launches = model(ids, positions, attn)
    assert calls == dict.fromkeys(calls, 2)
    # the same inputs to each projection up to an element's last bit
    rel = ((fused.float() - two_launches.float()).norm() / two_launches.float().norm()).item()
    assert rel < 1e-2, rel

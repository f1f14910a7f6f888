"""Linear layers place checkpoint tensors (whole or one shard) in the rows they own."""
import pytest
import torch

from hifc.layers.linear import MergedColumnLinear, QKVLinear, RowLinear

CPU = torch.device("cpu")


def test_qkv_shards_fill_their_rows_and_split_back():
    layer = QKVLinear(8, num_heads=4, num_kv_heads=2, head_dim=2, bias=True, dtype=torch.float32,
                      device=CPU)
    q, k, v = torch.randn(8, 8), torch.randn(4, 8), torch.randn(4, 8)
    for shard, w in zip("qkv", (q, k, v)):
        layer.load_weight(layer.weight, w, shard)
        layer.load_weight(layer.bias, torch.zeros(w.shape[0]), shard)
    x = torch.randn(3, 8)
    out_q, out_k, out_v = layer(x)
    torch.testing.assert_close(out_q, x @ q.T)
    torch.testing.assert_close(out_k, x @ k.T)
    torch.testing.assert_close(out_v, x @ v.T)
    with pytest.raises(ValueError, match="has shape \\(3, 8\\), the model expects \\(4, 8\\)"):
        layer.load_weight(layer.weight, torch.randn(3, 8), "k")
    with pytest.raises(ValueError, match="no shard 'o'"):
        layer.load_weight(layer.weight, k, "o")


def test_merged_layer_takes_shards_or_the_fused_tensor():
    layer = MergedColumnLinear(4, [3, 5], bias=False, dtype=torch.float32, device=CPU)
    fused = torch.randn(8, 4)
    layer.load_weight(layer.weight, fused, None)  # a checkpoint that stores gate_up whole
    assert torch.equal(layer.weight, fused)
    layer.load_weight(layer.weight, torch.zeros(5, 4), 1)
    assert torch.equal(layer.weight[:3], fused[:3]) and not layer.weight[3:].any()
    with pytest.raises(ValueError, match="no shard 2"):
        layer.load_weight(layer.weight, torch.zeros(5, 4), 2)
    row = RowLinear(4, 2, bias=False, dtype=torch.float32, device=CPU)
    with pytest.raises(ValueError, match="no shard 0"):
        row.load_weight(row.weight, torch.zeros(2, 4), 0)


def test_only_cuda_decode_batches_past_the_small_m_kernel_prefer_cublaslt():
    from hifc.layers.linear import prefers_cublaslt
    assert not prefers_cublaslt(torch.randn(32, 8))  # CPU: torch's own matmul


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_batches_run_through_cublaslt_and_restore_the_preference(monkeypatch):
    import hifc.layers.linear as linear_mod
    from hifc.layers.linear import LT_MAX_ROWS, linear, prefers_cublaslt
    from hifc.layers.triton_gemv import FULL_TILE_ROWS, MAX_ROWS

    seen = []
    real = torch.nn.functional.linear

    class Recording:  # the module's F, recording the preference each product runs under
        @staticmethod
        def linear(x, weight, bias=None):
            seen.append(torch.backends.cuda.preferred_blas_library())
            return real(x, weight, bias)

    monkeypatch.setattr(linear_mod, "F", Recording)
    before = torch.backends.cuda.preferred_blas_library()
    dev = torch.device("cuda")
    weight = torch.randn(384, 512, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(384, device=dev, dtype=torch.bfloat16)
    for m, lt in ((MAX_ROWS + 1, True), (FULL_TILE_ROWS - 1, True), (32, None),
                  (LT_MAX_ROWS, True), (LT_MAX_ROWS + 1, False), (512, False)):
        x = torch.randn(m, 512, device=dev, dtype=torch.bfloat16)
        assert prefers_cublaslt(x) is (lt is not False)
        seen.clear()
        out = linear(x, weight, bias)
        # 32 rows: the small-M kernel, no library product
        assert seen == ([] if lt is None else [torch._C._BlasBackend.Cublaslt if lt else before])
        torch.testing.assert_close(out.float(), (x.float() @ weight.float().T + bias.float()),
                                   rtol=2e-2, atol=2e-1)
        assert torch.backends.cuda.preferred_blas_library() == before

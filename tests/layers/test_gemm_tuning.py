"""Projections of more than 16 rows run through the kernel timed fastest for their shape."""
import dataclasses

import pytest
import torch
from torch import nn

from hifc.config import EngineConfig
from hifc.layers import gemm_tuning
from hifc.layers.linear import MergedColumnLinear, RowLinear, linear, tune_projections

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def no_choices_left():
    yield
    gemm_tuning.clear()


def default_for(m):
    return gemm_tuning.CUBLASLT if m <= 128 else gemm_tuning.CUBLAS


def test_row_counts_past_the_exact_ones_share_their_power_of_two():
    assert [gemm_tuning.rows_key(m) for m in (17, 24, 128, 129, 256, 257, 5000, 8192)] == \
        [17, 24, 128, 256, 256, 512, 8192, 8192]


def test_cpu_models_are_not_tuned_and_their_products_take_torchs_path():
    model = nn.ModuleList([MergedColumnLinear(8, [4, 4], bias=False, dtype=torch.float32,
                                              device=torch.device("cpu")),
                           RowLinear(8, 8, bias=True, dtype=torch.float32,
                                     device=torch.device("cpu"))])
    assert tune_projections(model, [32, 256]) == []
    assert gemm_tuning.choices() == {}
    x, w = torch.randn(32, 8), torch.randn(4, 8)
    assert gemm_tuning.run(x, w, None) is None
    torch.testing.assert_close(linear(x, w, None), x @ w.T)


def test_the_option_is_a_bool():
    assert EngineConfig().tune_gemms is True
    with pytest.raises(ValueError, match="tune_gemms must be True or False"):
        EngineConfig(tune_gemms="yes")


def test_without_cublaslt_only_torchs_paths_are_candidates(monkeypatch):
    from hifc.layers import cublaslt

    def unavailable(*args):
        raise cublaslt.CublasLtError("torch has not loaded libcublasLt")

    monkeypatch.setattr(gemm_tuning, "_plan", unavailable)
    assert gemm_tuning._candidates(32, 384, 512, torch.bfloat16, False, 0, (256, 256, 256)) == []


def test_a_torch_without_timing_events_in_graphs_tunes_nothing(monkeypatch, caplog):
    monkeypatch.setattr(gemm_tuning, "graph_timing_supported", lambda: False)
    weight = torch.zeros(8, 8)  # never touched: the tuning stops first
    with caplog.at_level("WARNING", logger=gemm_tuning.__name__):
        assert gemm_tuning.tune({(8, 8, torch.bfloat16, False): [(weight, None)]}, [32],
                                default_for) == []
    assert "torch 2.8" in caplog.text and gemm_tuning.choices() == {}


def test_this_torch_times_inside_graphs():  # the README's torch (2.13) and the GPU's (2.11)
    assert gemm_tuning.graph_timing_supported()


def product(x, w, b):
    y = x.float() @ w.float().T
    return y if b is None else y + b.float()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [24, 300])
def test_every_cublaslt_candidate_computes_the_product(dtype, bias, m):
    from hifc.layers.cublaslt import MatmulPlan, aligns_of
    dev = torch.device("cuda")
    n, k = 384, 512
    x = torch.randn(m, k, device=dev, dtype=dtype)
    w = torch.randn(n, k, device=dev, dtype=dtype)
    b = torch.randn(n, device=dev, dtype=dtype) if bias else None
    out = torch.empty(m, n, device=dev, dtype=dtype)
    plan = MatmulPlan(m, n, k, dtype, bias, dev.index or 0)
    algos = plan.candidates(aligns_of(x, w, out))
    assert algos and len(set(algos)) == len(algos)
    for algo in algos:
        out.fill_(float("nan"))
        plan.run(x, w, b, out, algo)
        torch.testing.assert_close(out.float(), product(x, w, b), rtol=2e-2, atol=0.25)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("bias", [False, True])
def test_tuned_products_match_the_product_eagerly_and_in_a_cuda_graph(bias):
    dev, dtype, n, k = torch.device("cuda"), torch.bfloat16, 384, 512
    projections = [(torch.randn(n, k, device=dev, dtype=dtype),
                    torch.randn(n, device=dev, dtype=dtype) if bias else None)
                   for _ in range(3)]
    tuned = gemm_tuning.tune({(n, k, dtype, bias): projections}, [24, 32, 300], default_for)
    assert [(t.rows, t.projections) for t in tuned] == [(24, 3), (32, 3), (512, 3)]
    for t in tuned:
        assert t.default == default_for(t.rows) and t.candidates >= 2
        assert t.chosen == t.default or t.chosen_us < t.default_us * (1 - gemm_tuning.MARGIN)
    assert len(gemm_tuning.choices()) == 3
    w, b = projections[1]
    for m in (24, 32, 300, 512):  # 300 takes 512's choice
        x = torch.randn(m, k, device=dev, dtype=dtype)
        y = gemm_tuning.run(x, w, b)
        assert y is not None and y.shape == (m, n)
        torch.testing.assert_close(y.float(), product(x, w, b), rtol=2e-2, atol=0.25)
        torch.testing.assert_close(linear(x, w, b), y)
    assert gemm_tuning.run(torch.randn(40, k, device=dev, dtype=dtype), w, b) is None
    other = torch.randn(256, k, device=dev, dtype=dtype)  # a shape not tuned
    assert gemm_tuning.run(torch.randn(32, k, device=dev, dtype=dtype), other, None) is None

    x = torch.randn(32, k, device=dev, dtype=dtype)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemm_tuning.run(x, w, b)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        y = gemm_tuning.run(x, w, b)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y.float(), product(x, w, b), rtol=2e-2, atol=0.25)

    again = gemm_tuning.tune({(n, k, dtype, bias): projections}, [32], default_for)
    assert again == [tuned[1]]  # kept from the first tuning, not timed again


@pytest.mark.gpu
@needs_gpu
def test_a_later_process_takes_the_choices_from_the_file_where_they_still_apply(
        tmp_path, monkeypatch):
    from hifc.layers.gemm_choices import ChoiceFile
    dev, dtype, n, k = torch.device("cuda"), torch.bfloat16, 384, 512
    projections = [(torch.randn(n, k, device=dev, dtype=dtype), None) for _ in range(3)]
    groups = {(n, k, dtype, False): projections}
    monkeypatch.setenv("HIFC_CACHE_ROOT", str(tmp_path))
    store = gemm_tuning.choice_file(groups)
    assert store.path.parent == tmp_path / "gemm-tuning"
    first = gemm_tuning.tune(groups, [24, 32, 300], default_for, store)
    chosen = gemm_tuning.choices()
    assert not any(t.from_file for t in first) and len(store.read()) == 3

    gemm_tuning.clear()  # as a new process finds it
    timed = []
    real_time = gemm_tuning._time
    monkeypatch.setattr(gemm_tuning, "_time", lambda *a: timed.append(a[0]) or real_time(*a))
    again = gemm_tuning.tune(groups, [24, 32, 300], default_for, gemm_tuning.choice_file(groups))
    assert timed == []  # nothing timed
    assert again == [dataclasses.replace(t, from_file=True) for t in first]
    assert gemm_tuning.choices() == chosen
    w, _ = projections[2]
    for m in (24, 32, 300):
        x = torch.randn(m, k, device=dev, dtype=dtype)
        torch.testing.assert_close(gemm_tuning.run(x, w, None).float(), product(x, w, None),
                                   rtol=2e-2, atol=0.25)

    # records that no longer apply are timed again (made against another default path, an
    # algorithm record cuBLASLt refuses, a damaged record); a row count not in the file is
    # timed and added
    saved = store.read()
    entry = {key[0]: key for key in saved}
    saved[entry[24]] = {**saved[entry[24]], "default": gemm_tuning.CUBLAS}
    saved[entry[32]] = {**saved[entry[32]], "choice": (b"\xff" * 64).hex()}
    saved[entry[512]] = {**saved[entry[512]], "choice": "not hex"}
    store.write(saved)
    gemm_tuning.clear()
    third = gemm_tuning.tune(groups, [24, 32, 64, 300], default_for, store)
    assert timed == [24, 32, 64, 512]
    assert not any(t.from_file for t in third)
    assert len(ChoiceFile(store.fingerprint, [[n, k, str(dtype), False]]).read()) == 4


@pytest.mark.gpu
@needs_gpu
def test_an_algorithm_choice_leaves_unaligned_or_strided_inputs_to_linear():
    from hifc.layers.cublaslt import MatmulPlan, aligns_of
    dev, dtype, m, n, k = torch.device("cuda"), torch.bfloat16, 32, 384, 512
    w = torch.randn(n, k, device=dev, dtype=dtype)
    x = torch.randn(m, k, device=dev, dtype=dtype)
    plan = MatmulPlan(m, n, k, dtype, False, dev.index or 0)
    algo = plan.candidates(aligns_of(x, w, torch.empty(m, n, device=dev, dtype=dtype)))[-1]
    gemm_tuning._chosen[(m, n, k, dtype, False, dev.index or 0)] = algo
    y = gemm_tuning.run(x, w, None)
    torch.testing.assert_close(y.float(), product(x, w, None), rtol=2e-2, atol=0.25)
    unaligned = torch.empty(m * k + 1, device=dev, dtype=dtype)[1:].view(m, k)
    unaligned.copy_(x)
    assert gemm_tuning.run(unaligned, w, None) is None
    strided = torch.randn(m, 2 * k, device=dev, dtype=dtype)[:, :k]
    assert gemm_tuning.run(strided, w, None) is None
    torch.testing.assert_close(linear(unaligned, w, None).float(), product(x, w, None),
                               rtol=2e-2, atol=0.25)


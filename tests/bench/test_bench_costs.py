"""The physical ideal's decode model: weights once per step, every running sequence's KV."""
from hifc.bench.costs import decode_bytes


def test_one_request_reads_its_growing_context_each_step():
    # prompt 10, 4 output tokens: the prefill yields one, 3 decode steps at contexts 11, 12, 13
    steps, nbytes = decode_bytes(100, 2, [(10, 4)], max_num_seqs=8)
    assert steps == 3
    assert nbytes == 3 * 100 + 2 * (11 + 12 + 13)


def test_requests_beyond_max_num_seqs_wait_for_a_free_slot():
    # two slots, three requests of 3 outputs (2 decode steps each): a, b run, then c
    steps, nbytes = decode_bytes(0, 1, [(1, 3), (1, 3), (5, 3)], max_num_seqs=2)
    assert steps == 4
    assert nbytes == (2 + 2) + (3 + 3) + 6 + 7


def test_single_token_outputs_need_no_decode_step():
    assert decode_bytes(100, 2, [(10, 1), (20, 1)], max_num_seqs=8) == (0, 0)


def test_matmul_rate_after_a_sustained_run_times_only_the_last_products(monkeypatch):
    """``after_s`` runs products back to back first (a GPU's clock falls under its power limit
    within a second of them); the rate is timed over the ``repeats`` after that."""
    import torch

    from hifc.bench import probes

    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    burst = probes.matmul_tflops("cpu", torch.float32, n=64, repeats=4)
    assert burst > 0 and len(calls) == 3 + 4  # warm-up, then the timed products
    calls.clear()
    sustained = probes.matmul_tflops("cpu", torch.float32, n=64, repeats=4, after_s=0.05)
    assert sustained > 0 and len(calls) >= 3 + 4 + 4  # at least one round before the timing

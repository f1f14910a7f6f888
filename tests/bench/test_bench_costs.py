"""The physical ideal: its decode model (weights once per step, every running sequence's KV) and
its prefill FLOPs."""
import pytest

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


def test_the_sustained_matmul_rate_times_only_the_products_after_a_run_of_them(monkeypatch):
    """The burst rate times the first products; the sustained one runs products back to back
    first (a GPU's clock falls under its power limit within a second of them) and times the
    ones after that."""
    import torch

    from hifc.bench import probes

    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    burst, sustained = probes.matmul_rates("cpu", torch.float32)
    assert burst > 0 and sustained > 0
    # warm-up, the burst's products, at least one round of 10 before the sustained timing, its 10
    assert len(calls) >= 3 + 10 + 10 + 10


def test_prefill_flops_are_the_products_a_prompt_runs():
    """One prompt's prefill on the CPU, its matrix products counted by torch: the ideal's
    FLOPs less its attention term (the CPU's attention runs no counted product), within the
    norm weights parameter_counts includes. The last layer's output projection and MLP run on
    the last token alone, as the ideal counts them."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hifc import LLM, SamplingParams
    from hifc.bench.costs import last_layer_tail, prefill_flops

    llm = LLM("random:tiny-llama", device="cpu", dtype="float32", cpu_threads=1)
    engine, tokens = llm.engine, 100
    arch = engine.arch
    with FlopCounterMode(display=False) as counter:
        llm.generate([list(range(3, 3 + tokens))], SamplingParams(max_tokens=1, temperature=0),
                     use_tqdm=False)
    counted = counter.get_total_flops()
    attention = 4 * arch.num_attention_heads * arch.head_dim * (
        (arch.num_hidden_layers - 1) * tokens ** 2 / 2 + tokens)
    assert counted == pytest.approx(prefill_flops(engine, tokens) - attention, rel=0.01)
    # every token through the whole last layer would be this many more
    assert 2 * last_layer_tail(engine) * (tokens - 1) > 0.3 * counted

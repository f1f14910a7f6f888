"""What a model's work costs at the device's limits: weight and KV bytes a decode step reads,
prefill FLOPs, and the physical ideal time of a whole workload.

The ideal runs every prefill at the measured matrix rate and every decode step at the measured
copy rate, reading the weights once per step and every running sequence's KV (vLLM-style
continuous batching of up to ``max_num_seqs`` sequences, no memory limit, no host time). A
benchmark's time divided into it says how far from the limit a run is.
"""
from __future__ import annotations

from collections import deque


def parameter_counts(engine) -> tuple[int, int]:
    """(decoder-layer parameters incl. the final norm, lm_head parameters): every parameter but
    the embedding table, whose rows are gathered, not multiplied (tied: it is the lm_head).
    With tensor parallelism, rank 0's part (its share of the vocabulary rows, padded)."""
    total = sum(p.numel() for p in engine.runner.model.parameters())
    arch = engine.arch
    ranks = engine.config.parallel.tensor_parallel_size
    head = -(-arch.vocab_size // ranks) * arch.hidden_size
    return total - head * (1 if arch.tie_word_embeddings else 2), head


def weight_bytes_read(engine) -> int:
    """Weight bytes a decode step reads: the layers' and the lm_head's."""
    body, head = parameter_counts(engine)
    return (body + head) * engine.dtype.itemsize


def kv_bytes_per_token(engine) -> int:
    return engine.limits.block_bytes // engine.config.block_size


def last_layer_tail(engine) -> int:
    """Parameters of the last layer's output projection and MLP, which only a token whose
    logits are needed goes through (every token's K/V comes before them)."""
    last = engine.runner.model.model.layers[-1]
    return sum(p.numel() for module in (last.self_attn.o_proj, last.mlp)
               for p in module.parameters())


def prefill_flops(engine, tokens: int) -> float:
    """Matmul FLOPs of prefilling one prompt, the work its first token needs: every layer on
    every token with causal attention (QK^T and PV over half the T x T square), except that
    the last layer's attention, output projection and MLP run for the last token only (its
    QKV projection for all: their K/V), as the lm_head does."""
    body, head = parameter_counts(engine)
    arch = engine.arch
    per_key = 2 * 2 * arch.num_attention_heads * arch.head_dim  # a query against one key
    attention = per_key * ((arch.num_hidden_layers - 1) * tokens ** 2 / 2 + tokens)
    return 2 * body * tokens - 2 * last_layer_tail(engine) * (tokens - 1) + 2 * head + attention


def decode_bytes(weight_bytes: int, kv_per_token: int, requests: list[tuple[int, int]],
                 max_num_seqs: int) -> tuple[int, int]:
    """(decode steps, bytes they read) when ``requests`` ((prompt tokens, output tokens) each,
    admitted in order) decode together, up to ``max_num_seqs`` at a time. The prefill yields
    each request's first token; every later token is one decode step reading the weights once
    and the KV of every running sequence."""
    queue = deque((prompt, output - 1) for prompt, output in requests if output > 1)
    running: list[list[int]] = []  # [context tokens, decode steps left]
    steps = total = 0
    while queue or running:
        while queue and len(running) < max_num_seqs:
            prompt, left = queue.popleft()
            running.append([prompt + 1, left])
        total += weight_bytes + kv_per_token * sum(ctx for ctx, _ in running)
        steps += 1
        for seq in running:
            seq[0] += 1
            seq[1] -= 1
        running = [seq for seq in running if seq[1] > 0]
    return steps, total


def physical_ideal(engine, requests: list[tuple[int, int]], copy_gbps: float,
                   matmul_tflops: float, sustained_tflops: float) -> dict:
    """The workload's ideal time on this engine's model and device (rates measured in the same
    run): prefill FLOPs at the matrix rate plus decode bytes at the copy rate ((read + write)
    bytes/s of a device copy, the same floor ``hifc bench kernels`` uses). ``matmul_tflops``
    is the burst rate; ``ideal_sustained_s`` puts the prefill at ``sustained_tflops``, the
    rate the device holds once its power limit lowers its clock (``hifc.bench.probes``)."""
    flops = sum(prefill_flops(engine, prompt) for prompt, _ in requests)
    prefill_s = flops / (matmul_tflops * 1e12)
    sustained_prefill_s = flops / (sustained_tflops * 1e12)
    steps, nbytes = decode_bytes(weight_bytes_read(engine), kv_bytes_per_token(engine),
                                 requests, engine.config.max_num_seqs)
    decode_s = nbytes / (copy_gbps * 1e9)
    return {"ideal_s": prefill_s + decode_s, "ideal_prefill_s": prefill_s,
            "ideal_decode_s": decode_s, "ideal_decode_steps": steps,
            "ideal_sustained_s": sustained_prefill_s + decode_s,
            "ideal_sustained_prefill_s": sustained_prefill_s,
            "copy_gbps": copy_gbps, "matmul_tflops": matmul_tflops,
            "sustained_tflops": sustained_tflops}

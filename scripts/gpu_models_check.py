"""Every architecture through both attention backends on a GPU: the torch reference run eagerly
against Triton with CUDA-graph decode, on the real-size random presets, in float32.

For each architecture: two seeded prompts, a short one and one longer than the sliding window
(where the model has one), greedy-decoded by (a) an engine with attention_backend="torch" and
enforce_eager, and (b) one with attention_backend="triton" whose decode steps replay CUDA graphs.
Both build the same seeded weights. Printed per architecture: whether the greedy tokens are equal,
the first position where they differ (prompt@token) with the reference's gap between its top two
logits there (a gap near the logit difference is a near tie, not a bug), and the largest |logit
difference| over the last positions of the long prompt's prefill (the model run once through
each backend).

Why float32: Triton runs its dots in tf32x3 there (float32 accuracy), so the backends differ by
~1e-5 in the logits and greedy tokens should be equal throughout. In bf16 they differ by ~1e-2,
and a random model's near-ties then let greedy paths part after a few tokens without either
being wrong; this script does not compare bf16.

Usage: PYTHONPATH=$PWD python3 scripts/gpu_models_check.py [--archs llama,gemma2] [--size tiny]
       PYTHONPATH=$PWD python3 scripts/gpu_models_check.py --device cpu   # both runs torch
Exit status 1 if any architecture fails (tokens differ or logits beyond --atol).
"""
from __future__ import annotations

import argparse
import gc
import random
import sys
import time

import torch

from hifc import LLM, SamplingParams
from hifc.layers.attention import AttentionContext, AttentionMetadata
from hifc.models import preset_arch

# architecture -> (real-size preset, tiny preset)
PRESETS = {
    "llama": ("ds-r1-llama-8b", "tiny-llama"),
    "qwen2": ("ds-r1-qwen-14b", "tiny-qwen2"),
    "mistral": ("mistral-7b", "tiny-mistral"),
    "qwen3": ("qwen3-8b", "tiny-qwen3"),
    "gemma2": ("gemma2-9b", "tiny-gemma2"),
    "phi3": ("phi3-mini", "tiny-phi3"),
}
BLOCK_SIZE = 16
LOGIT_POSITIONS = 32  # prefill logits compared at the long prompt's last positions


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--archs", default=",".join(PRESETS),
                        help=f"comma-separated subset of {','.join(PRESETS)}")
    parser.add_argument("--size", choices=["real", "tiny"], default=None,
                        help="presets to run (default: real on cuda, tiny on cpu)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--atol", type=float, default=1e-3,
                        help="largest prefill |logit difference| that passes")
    args = parser.parse_args()
    args.archs = [a for a in args.archs.split(",") if a]
    unknown = [a for a in args.archs if a not in PRESETS]
    if unknown:
        parser.error(f"unknown architectures {unknown}; choose from {','.join(PRESETS)}")
    if args.size is None:
        args.size = "real" if args.device == "cuda" else "tiny"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --device cpu")
    return args


def make_prompts(preset: str, max_tokens: int) -> tuple[list[list[int]], int]:
    """A short prompt and one 64 tokens past the sliding window (300 tokens without one), and
    the max_model_len that holds them."""
    arch = preset_arch(preset)
    long_len = arch.sliding_window + 64 if arch.sliding_window else 300
    max_model_len = -(-(long_len + max_tokens + 1) // BLOCK_SIZE) * BLOCK_SIZE
    if max_model_len > arch.max_position_embeddings:
        raise ValueError(f"{preset}: a {long_len}-token prompt exceeds the context")
    rng = random.Random(0)
    return [[rng.randrange(3, arch.vocab_size) for _ in range(n)] for n in (17, long_len)], \
        max_model_len


@torch.inference_mode()
def prefill_logits(llm: LLM, prompt: list[int], last: int = LOGIT_POSITIONS) -> torch.Tensor:
    """Logits ([last, V]) of the prompt's last positions, the model run once through the
    engine's attention backend over a scratch KV cache."""
    model, backend, device = llm.engine.runner.model, llm.engine.runner.backend, llm.engine.device
    arch = llm.engine.arch
    n = len(prompt)
    num_blocks = -(-n // BLOCK_SIZE)
    kv = torch.zeros(arch.num_hidden_layers, 2, num_blocks, BLOCK_SIZE, arch.num_key_value_heads,
                     arch.head_dim, dtype=llm.engine.dtype, device=device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=device),  # blocks 0.. in order
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        query_start_loc_cpu=[0, n], seq_lens_cpu=[n], max_query_len=n, max_seq_len=n,
        block_size=BLOCK_SIZE)
    ctx = AttentionContext(meta, list(kv.unbind(0)), backend, model.attention_layers)
    ids = torch.tensor(prompt, device=device)
    hidden = model(ids, torch.arange(n, device=device), ctx)  # [n, H]
    return model.compute_logits(hidden[-last:]).cpu()  # [last, V]


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> tuple[int, int] | None:
    """(prompt, token) of the first difference; None if there is none."""
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (s, t) in enumerate(zip(x, y)):
            if s != t:
                return i, j
        if len(x) != len(y):
            return i, min(len(x), len(y))
    return None


def run_engine(preset: str, device: str, backend: str, eager: bool, prompts: list[list[int]],
               max_model_len: int, max_tokens: int, compare_with: list[list[int]] | None = None
               ) -> tuple[list[list[int]], torch.Tensor, bool, float | None]:
    """(greedy tokens per prompt, long-prompt prefill logits, whether decode replayed graphs,
    the gap between the top two logits where the tokens first differ from compare_with)."""
    llm = LLM(f"random:{preset}", device=device, dtype="float32", attention_backend=backend,
              enforce_eager=eager, block_size=BLOCK_SIZE, max_model_len=max_model_len,
              max_num_seqs=len(prompts),
              num_gpu_blocks=len(prompts) * (max_model_len // BLOCK_SIZE) + 2, seed=0)
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        tokens = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        logits = prefill_logits(llm, prompts[-1])
        replayed = llm.engine.runner.num_graph_decode_steps > 0
        gap = None
        mismatch = first_mismatch(tokens, compare_with) if compare_with is not None else None
        if mismatch is not None:
            i, j = mismatch
            top2 = prefill_logits(llm, prompts[i] + tokens[i][:j], last=1)[0].topk(2).values
            gap = (top2[0] - top2[1]).item()
    finally:
        llm.close()
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return tokens, logits, replayed, gap


def main() -> int:
    args = parse_args()
    # on the CPU both runs take the torch backend: the same path minus Triton and graphs
    candidate = ("triton", False) if args.device == "cuda" else ("torch", True)
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'})"
          f", float32, {args.max_tokens} greedy tokens; (a) torch backend eager vs (b) "
          f"{candidate[0]} backend{' with CUDA graphs' if not candidate[1] else ' eager'}")
    header = (f"{'arch':8} {'preset':16} {'prompts':>10} {'tokens equal':>12} "
              f"{'first mismatch':>14} {'top-2 gap':>9} {'max|dlogit|':>11} {'graphs':>6} "
              f"{'seconds':>7}")
    print(header)
    print("-" * len(header))
    failed = []
    total_start = time.perf_counter()
    for name in args.archs:
        preset = PRESETS[name][0 if args.size == "real" else 1]
        start = time.perf_counter()
        prompts, max_model_len = make_prompts(preset, args.max_tokens)
        tokens, logits, replayed, _ = run_engine(preset, args.device, *candidate, prompts,
                                                 max_model_len, args.max_tokens)
        ref_tokens, ref_logits, _, gap = run_engine(preset, args.device, "torch", True, prompts,
                                                    max_model_len, args.max_tokens, tokens)
        diff = (logits - ref_logits).abs().max().item()
        equal = tokens == ref_tokens
        mismatch = first_mismatch(ref_tokens, tokens)
        where = "-" if mismatch is None else "{}@{}".format(*mismatch)
        lengths = "/".join(str(len(p)) for p in prompts)
        print(f"{name:8} {preset:16} {lengths:>10} {'y' if equal else 'n':>12} {where:>14} "
              f"{'-' if gap is None else f'{gap:.1e}':>9} {diff:11.2e} "
              f"{'y' if replayed else 'n':>6} {time.perf_counter() - start:7.1f}", flush=True)
        if not equal or not diff <= args.atol:
            failed.append(name)
    print(f"total {time.perf_counter() - total_start:.1f} s; "
          + (f"FAILED: {', '.join(failed)}" if failed else "all architectures match"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

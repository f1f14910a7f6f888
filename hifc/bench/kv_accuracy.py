"""How close a model's next-token distributions stay when its KV cache is stored in another dtype.

``position_logits`` prefills one sequence through the paged KV cache in one step and returns the
logits at every position: each query attends over keys and values read back from the cache (its
own included), so every position sees the cache's dtype exactly as a decode step would.
``compare`` then reports, over the positions, the KL divergence of the candidate's next-token
distribution from the reference's and how often their most likely tokens agree.
"""
from __future__ import annotations

import torch

from hifc.layers.attention import AttentionBackend, AttentionContext, AttentionMetadata
from hifc.runtime.kv_cache import allocate_kv_cache, kv_cache_scales

# A plain English passage (about 400 SmolLM2 tokens) to score positions on.
EVAL_TEXT = (
    "Flash memory stores data in cells that keep their charge without power. A solid state "
    "drive groups these cells into pages, which it writes, and into much larger blocks, which "
    "it must erase before writing them again. Because an erase covers a whole block, a drive "
    "that receives small random writes has to move valid pages around before it can free a "
    "block, and each such move is an extra write that wears the cells out. Engineers call the "
    "ratio of the bytes written to the cells to the bytes the host asked to write the write "
    "amplification factor. Sequential writes keep it close to one, because whole blocks fill "
    "up and become invalid together. Large language models need memory of a different kind. "
    "When a transformer generates text, it keeps the keys and values of every earlier token in "
    "a cache, so that each new token only has to compute its own. That cache grows by a few "
    "hundred kilobytes per token for a model with eight billion parameters, and a server that "
    "runs many conversations at once soon finds that the cache, not the weights, fills the "
    "memory of its graphics processor. When the memory runs out, the scheduler pauses one of "
    "the conversations and either throws its cache away, to recompute it later from the text, "
    "or copies it somewhere cheaper and copies it back when the conversation resumes. Main "
    "memory is the usual place, but it is expensive and limited. A fast drive holds far more "
    "for the same price, and if the cache is written to it as one sequential log, the drive "
    "sees the access pattern it handles best. Storing every key and value in eight bits "
    "instead of sixteen halves both the memory the cache takes and the bytes each swap must "
    "move, at the price of a small rounding error in the attention scores. Whether that error "
    "matters is an empirical question: one measures how often the model still picks the same "
    "next word, and how far its predicted distribution moves, over many positions of real "
    "text. The answer depends on the model, on the range of its keys and values, and on the "
    "scales used to map them into the narrow floating point format.")


def position_logits(model: torch.nn.Module, token_ids: list[int], kv_dtype: torch.dtype,
                    backend: AttentionBackend, checkpoint_scales: torch.Tensor | None = None,
                    block_size: int = 16) -> torch.Tensor:
    """Logits ([T, V] float32) of the next token at every position of ``token_ids``, prefilled in
    one step by ``model`` (a registry model class, as ``hifc.loader.load_model`` builds it)
    through a paged KV cache of ``kv_dtype``; a float8 cache is scaled as the engine scales it
    (``checkpoint_scales``, the loaded model's ``kv_scales``, else 1.0)."""
    arch = model.arch
    device = next(model.parameters()).device
    num_tokens = len(token_ids)
    num_blocks = -(-num_tokens // block_size)
    kv_cache = allocate_kv_cache(arch, num_blocks, block_size, kv_dtype, device)
    scales = kv_cache_scales(kv_dtype, arch, checkpoint_scales, device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens, device=device),  # [T]
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),  # [1]
        block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
        query_start_loc_cpu=[0, num_tokens], seq_lens_cpu=[num_tokens],
        max_query_len=num_tokens, max_seq_len=num_tokens, block_size=block_size)
    ctx = AttentionContext(meta, list(kv_cache.unbind(0)), backend, model.attention_layers,
                           list(scales.unbind(0)) if scales is not None else None)
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)  # [T]
    with torch.inference_mode():
        hidden = model(ids, torch.arange(num_tokens, device=device), ctx)  # [T, H]
        return model.compute_logits(hidden)  # [T, V]


def compare(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    """KL(reference || candidate) of the next-token distributions ([T, V] logits each) and the
    agreement of their argmax, over the T positions, in nats; and the reference's mean entropy
    (near log V: flat distributions, as random weights give, whose argmax is nearly a tie)."""
    ref_logp = torch.log_softmax(reference.float(), dim=-1)
    cand_logp = torch.log_softmax(candidate.float(), dim=-1)
    ref_p = ref_logp.exp()
    kl = (ref_p * (ref_logp - cand_logp)).sum(-1).clamp_min(0)  # [T]
    agree = (reference.argmax(-1) == candidate.argmax(-1)).float()  # [T]
    entropy = -(ref_p * ref_logp).sum(-1)  # [T]
    return {"positions": reference.shape[0], "mean_kl": kl.mean().item(),
            "max_kl": kl.max().item(), "p99_kl": kl.quantile(0.99).item(),
            "top1_agreement": agree.mean().item(), "reference_entropy": entropy.mean().item()}

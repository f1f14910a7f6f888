"""The FP8 KV cache on the real SmolLM2 model (float32 weights, CPU): next-token distributions
stay close to those of a float32 cache, and greedy outputs are unchanged by swapping to flash."""
import torch

from hifc import LLM, SamplingParams
from hifc.bench.kv_accuracy import EVAL_TEXT, compare, position_logits
from hifc.layers.attention import TorchAttentionBackend

PARAMS = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
BASE = dict(device="cpu", dtype="float32", block_size=16, max_model_len=96,
            kv_cache_dtype="fp8")
QUESTIONS = ["What is write amplification in a solid state drive?",
             "Why do append-only logs suit flash memory?",
             "How large is the key-value cache of a language model?"]


def test_fp8_next_token_distributions_stay_close_to_float32(smollm2):
    llm = smollm2[0]  # the session's float32 engine, float32 KV cache
    model = llm.engine.runner.model
    ids = llm.get_tokenizer().encode(EVAL_TEXT)
    assert len(ids) >= 300
    backend = TorchAttentionBackend()
    reference = position_logits(model, ids, torch.float32, backend)
    fp8 = position_logits(model, ids, torch.float8_e4m3fn, backend)
    result = compare(reference, fp8)
    # measured: mean KL 0.008, top-1 agreement 0.93 (bfloat16 weights and KV: 0.0013, 0.95)
    assert result["positions"] == len(ids)
    assert result["top1_agreement"] >= 0.9 and result["mean_kl"] < 0.03
    assert compare(reference, reference)["mean_kl"] < 1e-6  # the measure itself


def test_fp8_greedy_outputs_are_unchanged_by_swapping_to_flash(smollm2, tmp_path):
    """Swapped float8 blocks come back bit-exact. Prefix caching and chunked prefill are off
    here: they change where a prompt's prefill is cut, which moves float32 results by an ulp or
    so; rounded to float8, a few such values land one float8 step apart, and on this model that
    can flip a near-tie later on (tests/engine/test_fp8_kv.py checks both on the tiny model).
    For the same reason torch runs one thread here: with two, a product of a batch of five
    rounds otherwise than one of one row, and a greedy list parted at a near-tie."""
    threads = torch.get_num_threads()
    try:
        _swap_and_compare(smollm2, tmp_path)
    finally:
        torch.set_num_threads(threads)


def _swap_and_compare(smollm2, tmp_path):
    tokenizer = smollm2[0].get_tokenizer()
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                           add_generation_prompt=True) for q in QUESTIONS]
    # chats of ~40 tokens (3 blocks): 4 of them and their outputs do not fit in 7 blocks, one
    # alone does
    llm = LLM("smollm2-135m", num_gpu_blocks=7, max_num_seqs=4, enable_prefix_caching=False,
              enable_chunked_prefill=False, cpu_threads=1, kv_offload="flash",
              flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.05, **BASE)
    together = [o.token_ids for o in llm.generate(chats + chats[:1], PARAMS, use_tqdm=False)]
    stats = llm.stats()
    assert stats["preemptions"] > 0 and stats["swap_out_blocks"] > 0
    assert stats["swap_in_blocks"] == stats["swap_out_blocks"]
    alone = [o.token_ids for c in chats for o in llm.generate([c], PARAMS, use_tqdm=False)]
    assert llm.stats()["preemptions"] == stats["preemptions"]  # no pressure one at a time
    assert together == alone + alone[:1]
    stats = llm.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0
    llm.close()
    # an FP8 cache generates nearly the float32 cache's text: the same first token at least
    fp32 = [o.token_ids for o in smollm2[0].generate(chats, PARAMS, use_tqdm=False)]
    assert [t[0] for t in alone] == [t[0] for t in fp32]
    assert fp32 != alone  # the float8 cache is in use

"""SmolLM2 on the CPU: teacher-forced log-probabilities of a real text (the README's first
1,200 tokens, prefilled in chunks of 256) and 64 greedy tokens after it, in float32 and in
bfloat16; prints the bfloat16 run's agreement with float32."""
import json, sys
from pathlib import Path
from hifc import LLM, SamplingParams

text = Path(sys.argv[1]).read_text()  # README.md, as run: the tokens depend on its text
def run(dtype):
    llm = LLM("smollm2-135m", dtype=dtype, max_num_batched_tokens=256, max_model_len=4096)
    ids = llm.engine.tokenizer.encode(text)[:1200]
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(
        max_tokens=64, temperature=0, prompt_logprobs=1, ignore_eos=True), use_tqdm=False)[0]
    lps = []
    for pos, entry in enumerate(out.prompt_logprobs[1:], start=1):
        top = max(entry.items(), key=lambda kv: kv[1].logprob)[0]
        lps.append((entry[ids[pos]].logprob, top))
    llm.close()
    return lps, out.outputs[0].token_ids
f32, f32_tokens = run("float32")
b16, b16_tokens = run("bfloat16")
diff = [abs(a[0] - b[0]) for a, b in zip(f32, b16)]
top1 = sum(a[1] == b[1] for a, b in zip(f32, b16)) / len(f32)
same = next((i for i, (a, b) in enumerate(zip(f32_tokens, b16_tokens)) if a != b), len(f32_tokens))
print(json.dumps({"label": sys.argv[2], "positions": len(diff),
                  "mean_abs_logprob_diff": round(sum(diff) / len(diff), 4),
                  "max_abs_logprob_diff": round(max(diff), 4), "top1_agreement": round(top1, 4),
                  "greedy_tokens_equal_before_first_difference": same}))

"""SmolLM2 on the CPU: prompts of 4,000, 3,000 and 2,500 random token ids prefilled in chunks of
``argv[1]`` tokens (each later chunk after cached context), then 8 greedy tokens each; prints
the wall time and a digest of the tokens. Run it as a script (its directory, not the repo, is
first on sys.path), with the code under test first on ``PYTHONPATH``:
``PYTHONPATH=<hifc's parent>:$PWD python docs/results/2026-12-05-cpu-chunks/chunked_tokens.py
512 <label>``. The engine picks its CPU threads (one fewer than the cores)."""
import hashlib
import random
import sys
import time

from hifc import LLM, SamplingParams

rng = random.Random(0)
llm = LLM("smollm2-135m", max_num_batched_tokens=int(sys.argv[1]), max_model_len=8192,
          enable_prefix_caching=False)
prompts = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(n)]}
           for n in (4000, 3000, 2500)]
llm.generate(prompts[:1], SamplingParams(max_tokens=1))  # warm-up
start = time.perf_counter()
outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0))
elapsed = time.perf_counter() - start
ids = [o.outputs[0].token_ids for o in outs]
print(f"{sys.argv[2]} budget {sys.argv[1]}: {elapsed:.2f} s digest "
      f"{hashlib.sha1(str(ids).encode()).hexdigest()[:12]}", flush=True)

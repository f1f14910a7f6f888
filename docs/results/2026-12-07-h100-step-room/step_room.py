"""Peak activation memory of real steps against the estimate that StepTooLarge checks: the 8B
preset with an explicit 10 GiB pool, one step of N prompt tokens each (N = 4,096, 16,384, 65,536),
then the same pool with a budget that does not fit beside it (the error's text)."""
import sys
import time

import torch

from hifc.bench.probes import free_device_memory
from hifc.engine.limits import StepTooLarge, _activation_reserve_bytes
from hifc.engine.llm_engine import LLMEngine
from hifc.models.registry import size_estimate
from hifc.sampling_params import SamplingParams

GIB = 1 << 30
model = sys.argv[1] if len(sys.argv) > 1 else "random:ds-r1-llama-8b"
total = torch.cuda.mem_get_info()[1]
for budget in (4096, 16384, 65536):
    e = LLMEngine.from_options(model=model, kv_cache_gib=10.0, max_num_batched_tokens=budget,
                               max_model_len=4097, max_num_seqs=64)
    est = _activation_reserve_bytes(size_estimate(e.arch, e.dtype), e.arch.vocab_size, budget,
                                    64)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for i in range(budget // 4096):
        e.add_request(f"r{i}", [(7 * i + j) % 1000 + 1 for j in range(4096)], p)
    t = time.perf_counter()
    steps = 0
    while e.has_unfinished_requests():
        e.step()
        steps += 1
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    print(f"budget {budget:>6}  steps {steps}  peak above weights+pool {peak / GIB:6.2f} GiB  "
          f"estimate {est / GIB:6.2f} GiB  peak/estimate {peak / est:.2f}  "
          f"{time.perf_counter() - t:.2f} s", flush=True)
    del e
    free_device_memory(torch.device('cuda'))
free = torch.cuda.mem_get_info()[0]
try:
    LLMEngine.from_options(model=model, kv_cache_gib=round(free / GIB - 20, 1),
                           max_num_batched_tokens=65536, max_model_len=4097, max_num_seqs=64)
    print("no error")
except StepTooLarge as err:
    print("StepTooLarge:", err)

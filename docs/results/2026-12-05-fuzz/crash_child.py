"""An engine on the flash file argv[2] with the prefix store writing every full block, running
batches of four prompts over six 64-token prefixes (seeded by argv[3]) until it is killed."""
import random
import sys

import torch

from hifc import LLM, SamplingParams

torch.set_num_threads(1)
STORE = dict(device="cpu", dtype="float32", block_size=16, num_gpu_blocks=24, max_num_seqs=4,
             kv_offload="flash", num_tier_blocks=400, prefix_store="all",
             prefix_store_read="always", max_model_len=192)


def prefixes(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 380) for _ in range(64)] for _ in range(6)]


if __name__ == "__main__":
    model, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = LLM(model, flash_path=path, **STORE)
    rng = random.Random(-seed - 1)
    shared = prefixes(seed)
    print("ready", flush=True)
    while True:
        prompts = [rng.choice(shared) + [rng.randrange(3, 380) for _ in range(rng.randint(1, 40))]
                   for _ in range(4)]
        llm.generate(prompts, SamplingParams(max_tokens=rng.randint(1, 20), temperature=0,
                                             ignore_eos=True), use_tqdm=False)

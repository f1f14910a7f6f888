"""hf_overrides (vLLM's): model config values set before the model is built, the same way for
random presets, Hugging Face directories and GGUF files; a smaller num_hidden_layers loads the
checkpoint's first layers only."""
import json

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.config import EngineConfig, engine_config_from_args
from hifc.entrypoints.cli import build_parser
from hifc.loader import load_model, model_arch
from hifc.models.config import ModelArchConfig
from hifc.models.overrides import apply_overrides, override_keys
from hifc.models.presets import preset_arch
from tests.fixtures import greedy_decode_paged, make_tiny_hf_model, smollm2_gguf_path


def overrides(value) -> str | None:
    return EngineConfig(hf_overrides=value).hf_overrides


def test_the_config_holds_a_dict_or_its_json_as_sorted_json():
    assert overrides({"rope_theta": 5, "num_hidden_layers": 1}) \
        == overrides('{"num_hidden_layers": 1, "rope_theta": 5}') \
        == '{"num_hidden_layers": 1, "rope_theta": 5}'
    assert overrides(None) is None and overrides({}) is None and overrides("{}") is None


@pytest.mark.parametrize("value, message", [
    ("[1]", "must be a JSON object"), ("{num", "not valid JSON"), (3, "must be a JSON object"),
    ({"a": {1}}, "not JSON serializable")])
def test_the_config_refuses_what_is_no_json_object(value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(hf_overrides=value)


def test_the_command_line_flag_reaches_the_config():
    args = build_parser().parse_args(
        ["generate", "--prompt", "x", "--hf-overrides", '{ "num_hidden_layers":1 }'])
    assert engine_config_from_args(args).hf_overrides == '{"num_hidden_layers": 1}'


def test_keys_are_the_arch_fields_and_the_hugging_face_spellings_of_the_others():
    fields = set(ModelArchConfig.__dataclass_fields__)
    assert set(override_keys()) == fields | {"architectures", "eos_token_id",
                                             "attn_logit_softcapping", "final_logit_softcapping"}


def test_values_replace_the_arch_fields():
    arch = preset_arch("tiny-gemma2")
    cut = apply_overrides(arch, overrides({
        "num_hidden_layers": 1, "eos_token_id": 7, "rope_theta": 500, "final_logit_softcapping": 9,
        "sliding_window": None}))
    assert (cut.num_hidden_layers, cut.eos_token_ids, cut.final_logit_softcap) == (1, (7,), 9.0)
    assert cut.rope_theta == 500.0 and isinstance(cut.rope_theta, float)
    assert cut.sliding_window is None and cut.hidden_size == arch.hidden_size
    assert cut.layer_types == arch.layer_types[:1]  # the first layers keep their kinds
    assert apply_overrides(arch, None) is arch
    assert apply_overrides(arch, overrides({"eos_token_ids": [3, 4]})).eos_token_ids == (3, 4)
    renamed = apply_overrides(arch, overrides({"architectures": ["Gemma2ForCausalLM"]}))
    assert renamed == arch


@pytest.mark.parametrize("value, message", [
    ({"num_layers": 2}, "unknown key.*'num_layers'.*num_hidden_layers"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers cannot be '2'"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers cannot be 2.0"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings cannot be 1"),
    ({"num_hidden_layers": True}, "num_hidden_layers cannot be True"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be positive"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads"),
    ({"eos_token_id": 1, "eos_token_ids": [2]}, "sets eos_token_ids twice"),
    ({"architectures": "LlamaForCausalLM"}, "architectures must be a list of one name"),
])
def test_bad_values_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(preset_arch("tiny-llama"), overrides(value))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_checkpoint_cut_to_its_first_layer_matches_transformers_cut_alike(tmp_path, arch):
    from transformers import AutoModelForCausalLM
    path = make_tiny_hf_model(tmp_path, arch)  # 2 layers
    cut = overrides({"num_hidden_layers": 1})
    loaded = load_model(str(path), torch.float32, "cpu", hf_overrides=cut)
    assert loaded.arch.num_hidden_layers == 1 == len(loaded.model.model.layers)
    assert model_arch(str(path), cut) == loaded.arch
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                              num_hidden_layers=1)
    prompt = [1, 5, 9, 13, 2, 7]
    _, (logits,) = greedy_decode_paged(loaded.model, [prompt], num_tokens=1)
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    whole = load_model(str(path), torch.float32, "cpu")
    _, (whole_logits,) = greedy_decode_paged(whole.model, [prompt], num_tokens=1)
    assert not torch.allclose(whole_logits, logits, atol=1e-3)  # the cut is another model


def test_more_layers_than_the_checkpoint_holds_is_a_missing_weights_error(tmp_path):
    path = make_tiny_hf_model(tmp_path, "llama")
    with pytest.raises(ValueError, match="missing weights.*model.layers.2."):
        load_model(str(path), torch.float32, "cpu",
                   hf_overrides=overrides({"num_hidden_layers": 3}))


def test_a_gguf_cut_holds_the_files_first_layers():
    path = str(smollm2_gguf_path())
    whole = dict(load_model(path, torch.float32, "cpu").model.named_parameters())
    loaded = load_model(path, torch.float32, "cpu",
                        hf_overrides=overrides({"num_hidden_layers": 2}))
    cut = dict(loaded.model.named_parameters())
    assert loaded.arch.num_hidden_layers == 2 and loaded.tokenizer is not None
    assert cut.keys() == {name for name in whole
                          if not name.startswith("model.layers.")
                          or int(name.split(".")[2]) < 2}
    assert all(torch.equal(cut[name], whole[name]) for name in cut)


def test_an_engine_runs_a_cut_preset():
    llm = LLM("random:tiny-llama", device="cpu", num_gpu_blocks=16, block_size=16,
              hf_overrides={"num_hidden_layers": 1})
    assert llm.engine.arch.num_hidden_layers == 1
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}],
                       SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert json.loads(llm.engine.config.hf_overrides) == {"num_hidden_layers": 1}

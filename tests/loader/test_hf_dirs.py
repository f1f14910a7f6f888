"""Loading Hugging Face directories: sharding, tied embeddings, config variants, tokenizer."""
import json

import pytest
import torch

from hifc.loader import load_model
from hifc.loader.hf import read_hf_arch
from hifc.models.registry import arch_from_hf_config
from tests.fixtures import greedy_decode_paged, make_tiny_hf_model


def _params(loaded):
    return dict(loaded.model.named_parameters())


def test_sharded_safetensors_load_like_a_single_file(tmp_path):
    single = make_tiny_hf_model(tmp_path / "single", "mistral")
    sharded = make_tiny_hf_model(tmp_path / "sharded", "mistral", sharded=True)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    a = _params(load_model(str(single), torch.float32, "cpu"))
    b = _params(load_model(str(sharded), torch.float32, "cpu"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tied_embedding_llama_matches_transformers(tmp_path):
    from transformers import AutoModelForCausalLM
    path = make_tiny_hf_model(tmp_path, "llama", tie_word_embeddings=True)
    loaded = load_model(str(path), torch.float32, "cpu")
    assert loaded.arch.tie_word_embeddings and "lm_head.weight" not in _params(loaded)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    prompt = [1, 5, 9, 13, 2, 7]
    _, (logits,) = greedy_decode_paged(loaded.model, [prompt], num_tokens=1)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(torch.tensor([prompt])).logits[0],
                                   atol=1e-4, rtol=1e-4)


def test_classic_rope_keys_parse_like_rope_parameters(tmp_path):
    path = make_tiny_hf_model(tmp_path, "llama3")
    modern = read_hf_arch(path)
    cfg = json.loads((path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")  # the oldest spelling
    cfg["rope_scaling"] = params
    (path / "config.json").write_text(json.dumps(cfg))
    classic = read_hf_arch(path)
    assert classic == modern
    assert modern.rope_theta == 500000.0 and modern.rope_scaling["rope_type"] == "llama3"


def test_sliding_window_only_where_used():
    from transformers import MistralConfig, Qwen2Config
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=1, sliding_window=4096)
    qwen = dict(base, architectures=["Qwen2ForCausalLM"])
    off = arch_from_hf_config(Qwen2Config(use_sliding_window=False, **qwen))
    assert off.sliding_window is None and off.attention_bias
    assert [off.layer_window(i) for i in range(3)] == [None, None, None]
    # transformers' Qwen2: layers from max_window_layers on slide
    on = arch_from_hf_config(Qwen2Config(use_sliding_window=True, max_window_layers=1, **qwen))
    assert [on.layer_window(i) for i in range(3)] == [None, 4096, 4096]
    mistral = arch_from_hf_config(MistralConfig(architectures=["MistralForCausalLM"], **base))
    assert [mistral.layer_window(i) for i in range(3)] == [4096] * 3
    assert not mistral.attention_bias
    assert [a.sliding_window for a in mistral.attention_layers()] == [4096] * 3


def test_eos_ids_merge_config_generation_config_and_tokenizer(tmp_path):
    path = make_tiny_hf_model(tmp_path, "qwen2")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, eos_token_id=5)))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    loaded = load_model(str(path), torch.float32, "cpu")
    assert loaded.arch.eos_token_ids == (5, 7)
    assert loaded.tokenizer.eos_token_ids == frozenset({2, 5, 7})  # 2: the tokenizer's <|im_end|>


def test_tokenizer_round_trip_and_chat_template(tmp_path):
    path = make_tiny_hf_model(tmp_path, "llama")
    tok = load_model(str(path), torch.float32, "cpu").tokenizer
    text = "The key value cache grows with every token."
    ids = tok.encode(text)
    assert ids and tok.decode(ids) == text
    assert tok.encode(text, add_special_tokens=False) == ids  # no bos added by this tokenizer
    assert tok.decode([1] + ids + [2]) == text
    assert tok.decode([1] + ids, skip_special_tokens=False) == "<|im_start|>" + text
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert chat == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_without_chat_template_raises(tmp_path):
    path = make_tiny_hf_model(tmp_path, "llama")
    (path / "chat_template.jinja").unlink()
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    tok = load_model(str(path), torch.float32, "cpu").tokenizer
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "Hello"}])


def test_weights_only_directory_has_no_tokenizer(tmp_path):
    path = make_tiny_hf_model(tmp_path, "llama")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (path / name).unlink()
    loaded = load_model(str(path), torch.float32, "cpu")
    assert loaded.tokenizer is None and loaded.name == path.name

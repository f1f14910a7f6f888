"""hifc: an LLM inference engine with paged KV cache that swaps preempted KV blocks to flash.

The public names are imported on first use so that the torch-free parts of the package
(``hifc.core``, the flash allocator, the analysis tools) can be used without torch.
"""
from importlib import import_module

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutputKind", "RequestOutput",
           "CompletionOutput"]
__version__ = "0.1.0"

_PUBLIC = {
    "LLM": "hifc.engine.llm",
    "LLMEngine": "hifc.engine.llm_engine",
    "SamplingParams": "hifc.sampling_params",
    "RequestOutputKind": "hifc.sampling_params",
    "RequestOutput": "hifc.engine.outputs",
    "CompletionOutput": "hifc.engine.outputs",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hifc' has no attribute {name!r}")

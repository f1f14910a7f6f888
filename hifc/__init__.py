"""hifc: an LLM inference engine with paged KV cache that swaps preempted KV blocks to flash."""
from hifc.engine.llm import LLM
from hifc.engine.llm_engine import LLMEngine
from hifc.engine.outputs import CompletionOutput, RequestOutput
from hifc.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"

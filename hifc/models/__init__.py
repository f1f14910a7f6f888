"""Llama-family model definitions (Llama 2/3, Qwen2, Mistral) and architecture presets."""
from hifc.models.config import SUPPORTED_ARCHITECTURES, ModelArchConfig
from hifc.models.llama import LlamaForCausalLM
from hifc.models.presets import PRESETS, preset_arch

__all__ = ["LlamaForCausalLM", "ModelArchConfig", "PRESETS", "SUPPORTED_ARCHITECTURES",
           "preset_arch"]

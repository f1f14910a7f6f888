"""Decoder model families (Llama/Mistral/Qwen2, Qwen3, Gemma 2, Phi-3), the registry that maps
an architecture name to its code, and random-weight presets."""
from hifc.models.config import ModelArchConfig
from hifc.models.presets import PRESETS, preset_arch
from hifc.models.registry import ARCHITECTURES, build_model, size_estimate

__all__ = ["ARCHITECTURES", "ModelArchConfig", "PRESETS", "build_model", "preset_arch",
           "size_estimate"]

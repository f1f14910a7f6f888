"""The one place that says which code serves which architecture.

An ``ArchitectureSpec`` ties a Hugging Face architecture name (``config.architectures[0]``) to
its model class, the function that reads its transformers config, how checkpoint tensors map
onto the model (merged shards), and how llama.cpp names it in GGUF files. The loaders (Hugging
Face directories, GGUF files, random presets) and the engine's sizing all go through here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import torch
from torch import nn

from hifc.layers.tensor_parallel import SINGLE, TPShard, check_divides
from hifc.models import gemma2, llama, phi3, qwen3
from hifc.models.config import ModelArchConfig
from hifc.models.weights import ShardMap, load_weights

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class GGUFNaming:
    """How llama.cpp writes an architecture (tensor names are ``blk.N.<part>.weight``)."""

    arch_name: str  # general.architecture
    block_tensors: Mapping[str, str]  # <part> -> Hugging Face module under model.layers.N
    # "<arch>.<key>" metadata beyond the common keys -> transformers config field
    metadata: Mapping[str, str] = field(default_factory=dict)
    permuted_qk: bool = False  # llama.cpp interleaves the RoPE halves of Q/K rows
    norm_offset: float = 0.0  # what llama.cpp added to every norm weight (Gemma: 1)
    # config fields GGUF does not carry, derived from those it does (HF names in, HF names out)
    derived_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class ArchitectureSpec:
    name: str  # Hugging Face architectures[0]
    model_type: str  # transformers' model_type (its config class)
    model_class: type[nn.Module]  # built as model_class(arch, dtype, device, max_positions, tp)
    arch_from_hf: Callable[[PretrainedConfig, str], ModelArchConfig]  # (config, name)
    checkpoint_shards: ShardMap  # checkpoint module -> (merged module, shard)
    gguf: GGUFNaming | None = None

    def build(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device | str,
              max_positions: int | None = None, tp: TPShard = SINGLE) -> nn.Module:
        """The model (``tp``: this rank's part of it) with uninitialized parameters (load or
        randomize them next); ValueError if it does not split over ``tp.size`` ranks."""
        check_divides(arch, tp.size)
        return self.model_class(arch, dtype, torch.device(device), max_positions, tp)

    def load_weights(self, model: nn.Module,
                     weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill the model from Hugging Face-named tensors; ValueError naming what is wrong."""
        load_weights(model, weights, self.checkpoint_shards)


_LLAMA_GGUF_BLOCKS = MappingProxyType({
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"})

_GGUF_LLAMA = GGUFNaming("llama", _LLAMA_GGUF_BLOCKS, permuted_qk=True)
_GGUF_QWEN2 = GGUFNaming("qwen2", _LLAMA_GGUF_BLOCKS)
_GGUF_QWEN3 = GGUFNaming("qwen3", {**_LLAMA_GGUF_BLOCKS, "attn_q_norm": "self_attn.q_norm",
                                   "attn_k_norm": "self_attn.k_norm"})
_GGUF_GEMMA2 = GGUFNaming(
    "gemma2",
    {**_LLAMA_GGUF_BLOCKS, "post_attention_norm": "post_attention_layernorm",
     "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    metadata={"attn_logit_softcapping": "attn_logit_softcapping",
              "final_logit_softcapping": "final_logit_softcapping"},
    norm_offset=1.0, derived_config=gemma2.gguf_derived_config)
_GGUF_PHI3 = GGUFNaming("phi3", {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"})

# In this order in error messages. GGUF: llama.cpp writes Mistral as "llama" (told apart by the
# model's name, see spec_for_gguf).
ARCHITECTURES: Mapping[str, ArchitectureSpec] = MappingProxyType({spec.name: spec for spec in (
    ArchitectureSpec("LlamaForCausalLM", "llama", llama.LlamaForCausalLM, llama.arch_from_hf,
                     llama.CHECKPOINT_SHARDS, _GGUF_LLAMA),
    ArchitectureSpec("Qwen2ForCausalLM", "qwen2", llama.LlamaForCausalLM,
                     llama.qwen2_arch_from_hf, llama.CHECKPOINT_SHARDS, _GGUF_QWEN2),
    ArchitectureSpec("MistralForCausalLM", "mistral", llama.LlamaForCausalLM,
                     llama.arch_from_hf, llama.CHECKPOINT_SHARDS, _GGUF_LLAMA),
    ArchitectureSpec("Qwen3ForCausalLM", "qwen3", qwen3.Qwen3ForCausalLM, qwen3.arch_from_hf,
                     llama.CHECKPOINT_SHARDS, _GGUF_QWEN3),
    ArchitectureSpec("Gemma2ForCausalLM", "gemma2", gemma2.Gemma2ForCausalLM,
                     gemma2.arch_from_hf, llama.CHECKPOINT_SHARDS, _GGUF_GEMMA2),
    ArchitectureSpec("Phi3ForCausalLM", "phi3", phi3.Phi3ForCausalLM, phi3.arch_from_hf,
                     phi3.CHECKPOINT_SHARDS, _GGUF_PHI3),
)})


def _unsupported(names: Iterable[Any], where: str = "") -> ValueError:
    return ValueError(f"{where}unsupported architecture {', '.join(map(str, names))}; "
                      f"hifc supports {', '.join(ARCHITECTURES)}")


def spec_for(architecture: str) -> ArchitectureSpec:
    """The spec of a Hugging Face architecture name; ValueError listing the supported ones."""
    if architecture not in ARCHITECTURES:
        raise _unsupported([architecture])
    return ARCHITECTURES[architecture]


def spec_for_hf_config(config: PretrainedConfig, where: str = "") -> ArchitectureSpec:
    """The spec of a transformers config: the first supported name in ``architectures``, else
    the one of its model_type. where: prefixed to the error (e.g. the directory)."""
    names = list(config.architectures or [])
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not names:
        for spec in ARCHITECTURES.values():
            if spec.model_type == config.model_type:
                return spec
    raise _unsupported(names or [config.model_type], where)


def arch_from_hf_config(config: PretrainedConfig, where: str = "") -> ModelArchConfig:
    """Translate a transformers config object into a ModelArchConfig."""
    spec = spec_for_hf_config(config, where)
    return spec.arch_from_hf(config, spec.name)


def gguf_arch_names() -> list[str]:
    """The GGUF ``general.architecture`` values hifc reads, in registry order."""
    return list(dict.fromkeys(spec.gguf.arch_name for spec in ARCHITECTURES.values()
                              if spec.gguf is not None))


def spec_for_gguf(arch_name: str, model_name: str) -> ArchitectureSpec | None:
    """The spec for a GGUF file's general.architecture (None if unsupported). Where several
    architectures share a GGUF name, the one whose model_type the model's name contains."""
    candidates = [spec for spec in ARCHITECTURES.values()
                  if spec.gguf is not None and spec.gguf.arch_name == arch_name]
    named = [spec for spec in candidates if spec.model_type in model_name.lower()]
    return (named or candidates or [None])[0]


def build_model(arch: ModelArchConfig, dtype: torch.dtype, device: torch.device | str,
                max_positions: int | None = None) -> nn.Module:
    """The model class of ``arch.architecture``, parameters uninitialized."""
    return spec_for(arch.architecture).build(arch, dtype, device, max_positions)


@dataclass(frozen=True)
class SizeEstimate:
    parameter_bytes: int  # the weights in the model dtype
    activation_bytes_per_token: int  # the widest tensors a step keeps alive, per token


def activation_bytes_per_token(arch: ModelArchConfig, dtype: torch.dtype) -> int:
    """An upper estimate of one decoder layer's live tensors per token: residual stream, normed
    input and sub-layer output (4 x hidden), q/k/v and their rotated copies (2 x qkv width),
    gate/up and the activated product (3 x intermediate)."""
    qkv = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim
    per_token = 4 * arch.hidden_size + 2 * qkv + 3 * arch.intermediate_size
    return per_token * torch.empty((), dtype=dtype).element_size()


def size_estimate(arch: ModelArchConfig, dtype: torch.dtype) -> SizeEstimate:
    """Weights counted exactly (the model built on the meta device, no memory); activations as
    ``activation_bytes_per_token``."""
    model = build_model(arch, dtype, "meta")
    num_params = sum(p.numel() for p in model.parameters())
    return SizeEstimate(num_params * torch.empty((), dtype=dtype).element_size(),
                        activation_bytes_per_token(arch, dtype))

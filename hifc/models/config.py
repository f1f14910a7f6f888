"""What hifc needs to know of a decoder's architecture, and how to read it from transformers.

``ModelArchConfig`` holds the shapes (which the KV cache and the tiers read through
num_hidden_layers / num_key_value_heads / head_dim) and the few switches the model families
differ by. ``common_hf_fields`` reads the fields every transformers decoder config spells alike;
each model file adds its own (``hifc.models.registry`` says which file serves which config).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hifc.layers.activation import GATED_ACTIVATIONS
from hifc.layers.attention import LayerAttention
from hifc.layers.rotary import check_rope_scaling, rope_type_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types values


@dataclass(frozen=True)
class ModelArchConfig:
    architecture: str  # Hugging Face architectures[0], e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # HF-style rope_scaling dict, e.g. {"rope_type": "llama3", "factor": 8.0, ...}; None = plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    hidden_act: str = "silu"  # the gated MLP's activation (a key of GATED_ACTIVATIONS)
    # A query sees itself and the sliding_window - 1 keys before it, in the layers layer_types
    # marks "sliding_attention" (every layer if layer_types is None); None: full attention.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    attention_scale: float | None = None  # q.k multiplier; None: head_dim ** -0.5
    attn_logit_softcap: float | None = None  # attention scores -> cap * tanh(score / cap)
    final_logit_softcap: float | None = None  # LM-head logits -> cap * tanh(logit / cap)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.hidden_act not in GATED_ACTIVATIONS:
            raise ValueError(f"model config: unsupported hidden_act {self.hidden_act!r}; hifc "
                             f"supports {', '.join(GATED_ACTIVATIONS)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"model config: sliding_window must be positive, got "
                             f"{self.sliding_window}")
        if self.layer_types is not None and (len(self.layer_types) != self.num_hidden_layers
                                             or not set(self.layer_types) <= {SLIDING, FULL}):
            raise ValueError(f"model config: layer_types must give {SLIDING!r} or {FULL!r} for "
                             f"each of the {self.num_hidden_layers} layers")

    def layer_window(self, layer_idx: int) -> int | None:
        """The sliding window of layer ``layer_idx``; None: it attends to the whole context."""
        if self.layer_types is not None and self.layer_types[layer_idx] != SLIDING:
            return None
        return self.sliding_window

    def attention_layers(self) -> tuple[LayerAttention, ...]:
        """How each layer attends: scale, window and soft-capping."""
        scale = self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale
        return tuple(LayerAttention(scale, self.layer_window(i), self.attn_logit_softcap)
                     for i in range(self.num_hidden_layers))


def rope_from_hf(config: PretrainedConfig) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from a transformers config's rope_parameters; ValueError for a
    scaling kind hifc does not implement."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(params.pop("rope_theta", getattr(config, "rope_theta", 10000.0)))
    params.pop("partial_rotary_factor", None)  # whole-head RoPE; model files refuse < 1
    if rope_type_of(params) == "default":
        return theta, None
    params.pop("type", None)  # the older spelling, already in rope_type
    check_rope_scaling(params)
    return theta, params


def token_ids(value: Any) -> tuple[int, ...]:
    """None, one id or a list of ids -> a tuple of ids."""
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def common_hf_fields(config: PretrainedConfig) -> dict[str, Any]:
    """The ModelArchConfig fields (all but architecture) that every transformers decoder config
    spells the same way."""
    heads = config.num_attention_heads
    theta, scaling = rope_from_hf(config)
    window = getattr(config, "sliding_window", None)
    layer_types = tuple(getattr(config, "layer_types", None) or ())
    if window is None or not layer_types or all(t == SLIDING for t in layer_types):
        layer_types = None  # one kind for every layer
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=config.num_key_value_heads or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=bool(config.tie_word_embeddings),
        sliding_window=window,
        layer_types=layer_types,
        bos_token_id=config.bos_token_id,
        eos_token_ids=token_ids(config.eos_token_id),
    )

"""Model definitions."""

from forge_jax.models.llama import (
    PRESETS,
    MLP,
    Attention,
    Block,
    Llama,
    LlamaConfig,
    RMSNorm,
    apply_rotary_embedding,
    cross_entropy_loss,
    get_config,
    num_params,
    rotary_embedding,
)

__all__ = [
    "PRESETS",
    "MLP",
    "Attention",
    "Block",
    "Llama",
    "LlamaConfig",
    "RMSNorm",
    "apply_rotary_embedding",
    "cross_entropy_loss",
    "get_config",
    "num_params",
    "rotary_embedding",
]

"""A Llama-style decoder-only transformer in ``flax.linen``.

The architecture follows Llama 2/3: pre-norm residual blocks with RMSNorm,
rotary position embeddings (half-split rotation), grouped-query causal
self-attention and a SwiGLU MLP, with no biases anywhere.

Every attention and MLP projection (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``) is created through the
configurable ``dense_cls`` of :class:`Llama` (default
:class:`flax.linen.Dense`), so a caller can swap in any drop-in replacement
with the same constructor signature and a ``(B, S, d_in) -> (B, S, d_out)``
call. Projection kernels are always 2-D ``(in, out)``; heads are formed by
reshaping after the projection. The untied ``lm_head`` is built by
``head_cls`` (default :class:`flax.linen.Dense`; a ForgeDense there keeps
the (D, V) head gradient out of memory too).

Shape legend used in the docstrings:
  B: batch size, S: sequence length, D: ``d_model``, H: ``n_heads``,
  K: ``n_kv_heads``, Dh: head dim (``D // H``), F: ``ffn_dim``,
  V: ``vocab_size``.

Example:
  >>> cfg = PRESETS["cpu-tiny"]
  >>> model = Llama(cfg)
  >>> tokens = jnp.zeros((2, 16), jnp.int32)
  >>> params = model.init(jax.random.PRNGKey(0), tokens)["params"]
  >>> logits = model.apply({"params": params}, tokens)  # float32 (2, 16, 256)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any, Callable, Dict

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from forge_jax._src import dense as dense_lib
from forge_jax._src.inplace_scan import inplace_scan, recompute_elementwise
from pallas_kernels import quantization

__all__ = [
    "LlamaConfig",
    "tensor_parallel_specs",
    "num_params",
    "PRESETS",
    "get_config",
    "RMSNorm",
    "rotary_embedding",
    "apply_rotary_embedding",
    "Attention",
    "MLP",
    "Block",
    "Llama",
    "cross_entropy_loss",
]

DType = Any
INIT_STD = 0.02
"""Standard deviation of the normal init for embeddings and projections."""


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "auto")
"""Values of ``LlamaConfig.attention``."""


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyper-parameters of a :class:`Llama` model.

  Attributes:
    vocab_size: Number of tokens in the vocabulary (V).
    d_model: Width of the residual stream (D). Must be divisible by
      ``n_heads`` and give an even head dim (needed by RoPE).
    n_layers: Number of transformer blocks.
    n_heads: Number of query heads (H).
    n_kv_heads: Number of key/value heads (K) for grouped-query attention;
      ``n_heads`` must be divisible by it. ``n_kv_heads == n_heads`` is
      ordinary multi-head attention, ``1`` is multi-query attention.
    ffn_dim: Hidden width of the SwiGLU MLP (F).
    max_seq_len: Longest sequence the model accepts.
    rope_theta: RoPE base frequency (10000 for Llama 2, 500000 for Llama 3).
    norm_eps: Epsilon of RMSNorm.
    tie_embeddings: If True there is no ``lm_head``; logits are
      ``embed.attend(h)`` with the input embedding matrix.
    dtype: Compute dtype of activations and matmuls (e.g. ``jnp.bfloat16``).
      Norms, RoPE and softmax are always float32.
    logits_dtype: dtype of the returned logits (default float32). The head's
      matmul already produces them in ``dtype``, so with bf16 compute
      ``jnp.bfloat16`` here loses nothing and halves the largest activation,
      ``(B, S, V)`` (and its gradient, with :func:`cross_entropy_loss`).
    param_dtype: Storage dtype of the parameters.
    remat: If True, wrap each block in ``nn.remat`` (activation
      checkpointing): less memory, one extra forward pass per block.
    attn_head_dim: Per-head width if not ``d_model // n_heads`` (Qwen3-32B:
      64 heads of 128 on a 5120-wide stream); must be even.
    qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3), with
      ``(head_dim,)`` scales ``q_norm`` / ``k_norm``.
    scan_layers: Stack the blocks with ``nn.scan`` (one traced block; params
      and ``forge_state`` under ``layers/block`` with a leading
      ``(n_layers,)`` axis), the usual idiom of large JAX models. In a fused
      step the scanned blocks' kernels and moments are updated in place
      (``forge_jax._src.inplace_scan``: with ``remat`` each block is
      rematerialized in the backward pass; without, the forward saves its
      matmul and attention outputs and the backward recomputes the
      elementwise rest, ``fj.recompute_elementwise``), so scanning costs no
      second stack of them.
    tensor_parallel_axis: Mesh axis name for Megatron-style tensor
      parallelism of the fused projections: q/k/v and gate/up split by
      columns, o and down by rows (``ForgeDense.kernel_axes``); run the
      fused step under ``with jax.set_mesh(mesh):``. Needs ForgeDense
      projections; heads, kv heads and ``ffn_dim`` must divide by the axis.
    attention: How causal attention is computed. ``"einsum"`` (default):
      explicit fp32 scores ``(B, H, S, S)`` and softmax, materialized (and
      their gradients in the backward pass: about 4·H·S² bytes per
      block); ``"xla"``, ``"cudnn"`` or ``"auto"``:
      :func:`jax.nn.dot_product_attention` with that ``implementation``
      (``"cudnn"``: the fused flash-attention kernel on NVIDIA GPUs, no
      S×S scores in memory; needs a GPU with cuDNN and bf16/fp16
      compute; ``"auto"``: ``implementation=None``, jax's default, which in
      jax 0.10 is the XLA path, not cuDNN). All compute softmax in fp32 and
      agree to rounding.

  Raises:
    ValueError: If a field is invalid; the message names the field.
  """

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  ffn_dim: int
  max_seq_len: int
  rope_theta: float = 10000.0
  norm_eps: float = 1e-5
  tie_embeddings: bool = False
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  remat: bool = False
  attn_head_dim: int | None = None
  qk_norm: bool = False
  scan_layers: bool = False
  tensor_parallel_axis: str | None = None
  attention: str = "einsum"
  logits_dtype: DType = jnp.float32

  def __post_init__(self):
    try:
      floating = jnp.issubdtype(jnp.dtype(self.logits_dtype), jnp.floating)
    except TypeError:
      floating = False
    if not floating:
      raise ValueError(f"logits_dtype must be a floating dtype, got "
                       f"{self.logits_dtype!r}")
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"attention must be one of {ATTENTION_IMPLEMENTATIONS}, "
                       f"got {self.attention!r}")
    sizes = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
             "ffn_dim", "max_seq_len")
    for name in (*sizes, "attn_head_dim"):
      value = getattr(self, name)
      if isinstance(value, np.integer):  # e.g. a size read from a numpy array
        object.__setattr__(self, name, int(value))
    for name in sizes:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.attn_head_dim is not None:
      if (not isinstance(self.attn_head_dim, int) or self.attn_head_dim <= 0
          or self.attn_head_dim % 2):
        raise ValueError(f"attn_head_dim must be a positive even int, got "
                         f"{self.attn_head_dim!r}")
    elif self.d_model % self.n_heads != 0:
      raise ValueError(
          f"d_model ({self.d_model}) must be divisible by n_heads "
          f"({self.n_heads})")
    if self.n_heads % self.n_kv_heads != 0:
      raise ValueError(
          f"n_heads ({self.n_heads}) must be divisible by n_kv_heads "
          f"({self.n_kv_heads})")
    if self.head_dim % 2 != 0:
      raise ValueError(
          f"head dim d_model // n_heads ({self.d_model // self.n_heads}) "
          "must be even for rotary embeddings")
    if not self.rope_theta > 0:
      raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
    if not self.norm_eps > 0:
      raise ValueError(f"norm_eps must be > 0, got {self.norm_eps!r}")

  @property
  def head_dim(self) -> int:
    """Per-head width Dh: ``attn_head_dim``, else ``d_model // n_heads``."""
    return self.attn_head_dim or self.d_model // self.n_heads

  @property
  def n_rep(self) -> int:
    """Number of query heads sharing each key/value head (H // K)."""
    return self.n_heads // self.n_kv_heads


def num_params(config: LlamaConfig) -> int:
  """Exact number of parameters of ``Llama(config)``, computed analytically.

  Args:
    config: Model config.

  Returns:
    Total parameter count, including the embedding, and the ``lm_head``
    unless ``config.tie_embeddings``.
  """
  d, hd = config.d_model, config.head_dim
  attn = (d * config.n_heads * hd            # q_proj
          + 2 * d * config.n_kv_heads * hd   # k_proj, v_proj
          + config.n_heads * hd * d)         # o_proj
  mlp = 3 * d * config.ffn_dim               # gate_proj, up_proj, down_proj
  block = attn + mlp + 2 * d                 # + attn_norm, mlp_norm scales
  if config.qk_norm:
    block += 2 * hd                          # q_norm, k_norm scales
  embed = config.vocab_size * d
  lm_head = 0 if config.tie_embeddings else d * config.vocab_size
  return embed + config.n_layers * block + d + lm_head  # + final norm


PRESETS: Dict[str, LlamaConfig] = {
    # The published architectures, for memory and speed experiments with
    # random weights (bf16 storage and compute). Qwen3 has QK-norm and
    # 128-wide heads; all three have untied embeddings.
    "llama3.1-8b": LlamaConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        ffn_dim=14336, max_seq_len=8192, rope_theta=500000.0, norm_eps=1e-5,
        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16),
    "qwen3-14b": LlamaConfig(
        vocab_size=151936, d_model=5120, n_layers=40, n_heads=40, n_kv_heads=8,
        ffn_dim=17408, max_seq_len=8192, rope_theta=1000000.0, norm_eps=1e-6,
        attn_head_dim=128, qk_norm=True, dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16),
    "qwen3-32b": LlamaConfig(
        vocab_size=151936, d_model=5120, n_layers=64, n_heads=64, n_kv_heads=8,
        ffn_dim=25600, max_seq_len=8192, rope_theta=1000000.0, norm_eps=1e-6,
        attn_head_dim=128, qk_norm=True, dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16),
    # Byte-level toy model that trains in minutes on a couple of CPU cores.
    # 853,120 parameters.
    "cpu-tiny": LlamaConfig(
        vocab_size=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
        ffn_dim=384, max_seq_len=128),
    # GPT-2 vocab, tied embeddings: 57,199,616 parameters.
    "60m": LlamaConfig(
        vocab_size=50257, d_model=512, n_layers=10, n_heads=8, n_kv_heads=4,
        ffn_dim=1536, max_seq_len=512, tie_embeddings=True),
    # GPT-2 vocab, tied embeddings: 130,629,120 parameters.
    "130m": LlamaConfig(
        vocab_size=50257, d_model=768, n_layers=12, n_heads=12, n_kv_heads=6,
        ffn_dim=2560, max_seq_len=1024, tie_embeddings=True),
}
"""Named configs. Override fields with ``dataclasses.replace`` or
:func:`get_config`, e.g. ``get_config("60m", vocab_size=32000)``."""


def get_config(name: str, **overrides: Any) -> LlamaConfig:
  """Returns ``PRESETS[name]`` with ``overrides`` applied (and re-validated).

  Args:
    name: A key of :data:`PRESETS`.
    **overrides: Fields to replace, e.g. ``vocab_size=32000, remat=True``.

  Raises:
    KeyError: If ``name`` is not a preset.
    ValueError: If the overridden config is invalid.
  """
  if name not in PRESETS:
    raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
  return dataclasses.replace(PRESETS[name], **overrides)


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


class RMSNorm(nn.Module):
  """Root-mean-square layer norm with a learnable ``scale`` (init ones).

  Computed in float32 regardless of the input dtype.

  Attributes:
    eps: Added to the mean square before the reciprocal square root.
    dtype: Output dtype.
    param_dtype: Dtype of ``scale``.
  """

  eps: float = 1e-5
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes over the last axis.

    Args:
      x: ``(..., D)`` array of any float dtype.

    Returns:
      ``(..., D)`` array of ``self.dtype``.
    """
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],),
                       self.param_dtype)
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.eps) * scale.astype(jnp.float32)
    return y.astype(self.dtype)


def rotary_embedding(positions: jax.Array, head_dim: int,
                     theta: float = 10000.0) -> tuple[jax.Array, jax.Array]:
  """RoPE angle tables.

  Args:
    positions: int ``(S,)`` token positions.
    head_dim: Even per-head width Dh.
    theta: Base frequency.

  Returns:
    ``(cos, sin)``, each float32 ``(S, Dh // 2)``, where the angle of
    position ``p`` and frequency ``i`` is ``p * theta ** (-2 i / Dh)``.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                              / head_dim))
  angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rotary_embedding(x: jax.Array, positions: jax.Array,
                           theta: float = 10000.0) -> jax.Array:
  """Rotates ``x`` by its position (half-split / GPT-NeoX convention).

  The first and second halves of the head dim form the (real, imaginary)
  pairs: ``out = concat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``.
  Computed in float32.

  Args:
    x: ``(B, S, N, Dh)`` queries or keys (N heads), any float dtype.
    positions: int ``(S,)`` positions of the sequence axis.
    theta: Base frequency.

  Returns:
    ``(B, S, N, Dh)`` array of ``x.dtype``.
  """
  cos, sin = rotary_embedding(positions, x.shape[-1], theta)
  cos, sin = cos[None, :, None, :], sin[None, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _normal(std: float) -> Callable[..., jax.Array]:
  return nn.initializers.normal(stddev=std)


def _projection(dense_cls, cfg: LlamaConfig, features: int, name: str,
                std: float = INIT_STD, split: str = "columns") -> nn.Module:
  """A bias-free projection built by ``dense_cls`` (flax Dense or ForgeDense).

  With ``cfg.tensor_parallel_axis`` its kernel is split over that axis by
  ``split`` ('columns' or 'rows'), through ForgeDense's ``kernel_axes``.
  """
  kw = {}
  if cfg.tensor_parallel_axis is not None:
    a = cfg.tensor_parallel_axis
    kw["kernel_axes"] = (None, a) if split == "columns" else (a, None)
  try:
    return dense_cls(features=features, use_bias=False, dtype=cfg.dtype,
                     param_dtype=cfg.param_dtype, kernel_init=_normal(std),
                     name=name, **kw)
  except TypeError as e:
    if kw:
      raise ValueError(
          "LlamaConfig.tensor_parallel_axis needs ForgeDense projections "
          f"(dense_cls accepting kernel_axes): {e}") from e
    raise


def _einsum_attention(q, k, v, cfg: LlamaConfig) -> jax.Array:
  """Causal attention with explicit fp32 scores (``attention='einsum'``).

  ``q`` (B, S, H, Dh), ``k``/``v`` (B, S, K, Dh) -> (B, S, H, Dh) of
  ``cfg.dtype``; query head i uses kv head i // n_rep.
  """
  s = q.shape[1]
  if cfg.n_rep > 1:
    k = jnp.repeat(k, cfg.n_rep, axis=2)
    v = jnp.repeat(v, cfg.n_rep, axis=2)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(q.shape[-1]))
  causal = jnp.tril(jnp.ones((s, s), dtype=jnp.bool_))
  scores = jnp.where(causal[None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


class Attention(nn.Module):
  """Causal grouped-query self-attention with RoPE.

  Attributes:
    config: Model config.
    dense_cls: Constructor of the q/k/v/o projections; called as
      ``dense_cls(features=..., use_bias=False, dtype=..., param_dtype=...,
      kernel_init=..., name=...)`` and applied to 3-D ``(B, S, d_in)`` inputs.
  """

  config: LlamaConfig
  dense_cls: Callable[..., nn.Module] = nn.Dense

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies attention over positions ``0 .. S-1``.

    Args:
      x: ``(B, S, D)`` array of ``config.dtype``.

    Returns:
      ``(B, S, D)`` array of ``config.dtype``.
    """
    cfg = self.config
    b, s, _ = x.shape
    h, k_heads, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    dense = functools.partial(_projection, self.dense_cls, cfg)

    q = dense(h * hd, "q_proj")(x).reshape(b, s, h, hd)
    k = dense(k_heads * hd, "k_proj")(x).reshape(b, s, k_heads, hd)
    v = dense(k_heads * hd, "v_proj")(x).reshape(b, s, k_heads, hd)

    positions = jnp.arange(s, dtype=jnp.int32)
    if cfg.qk_norm:
      def head_norm(name):
        return RMSNorm(eps=cfg.norm_eps, dtype=cfg.dtype,
                       param_dtype=cfg.param_dtype, name=name)
      q, k = head_norm("q_norm")(q), head_norm("k_norm")(k)
    q = apply_rotary_embedding(q, positions, cfg.rope_theta)
    k = apply_rotary_embedding(k, positions, cfg.rope_theta)

    if cfg.attention == "einsum":
      out = _einsum_attention(q, k, v, cfg)
    else:
      # (B, S, H, Dh) queries against (B, S, K, Dh) keys/values: jax groups
      # query heads over kv heads itself (head i uses kv head i // n_rep).
      out = jax.nn.dot_product_attention(
          q, k, v, scale=1.0 / math.sqrt(hd), is_causal=True,
          implementation=None if cfg.attention == "auto" else cfg.attention
      ).astype(cfg.dtype)
    out = out.reshape(b, s, h * hd)

    o_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    return dense(cfg.d_model, "o_proj", o_std, split="rows")(out)


class MLP(nn.Module):
  """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``.

  Attributes:
    config: Model config.
    dense_cls: Constructor of gate/up/down projections (see
      :class:`Attention`).
  """

  config: LlamaConfig
  dense_cls: Callable[..., nn.Module] = nn.Dense

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the MLP.

    Args:
      x: ``(B, S, D)`` array of ``config.dtype``.

    Returns:
      ``(B, S, D)`` array of ``config.dtype``.
    """
    cfg = self.config

    dense = functools.partial(_projection, self.dense_cls, cfg)

    gate = dense(cfg.ffn_dim, "gate_proj")(x)
    up = dense(cfg.ffn_dim, "up_proj")(x)
    down_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    return dense(cfg.d_model, "down_proj", down_std, split="rows")(
        nn.silu(gate) * up)


class Block(nn.Module):
  """Pre-norm transformer block: ``x + attn(norm(x))`` then ``+ mlp(norm(.))``.

  Attributes:
    config: Model config.
    dense_cls: Projection constructor passed to :class:`Attention` and
      :class:`MLP`.
  """

  config: LlamaConfig
  dense_cls: Callable[..., nn.Module] = nn.Dense

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies the block.

    Args:
      x: ``(B, S, D)`` residual stream of ``config.dtype``.

    Returns:
      ``(B, S, D)`` array of ``config.dtype``.
    """
    cfg = self.config

    def norm(name):
      return RMSNorm(eps=cfg.norm_eps, dtype=cfg.dtype,
                     param_dtype=cfg.param_dtype, name=name)

    x = x + Attention(cfg, self.dense_cls, name="attn")(norm("attn_norm")(x))
    x = x + MLP(cfg, self.dense_cls, name="mlp")(norm("mlp_norm")(x))
    return x


RematBlock = nn.remat(Block)


class _ScanStep(nn.Module):
  """One block as an ``nn.scan`` step: ``(x, None) -> (block(x), None)``."""

  config: LlamaConfig
  dense_cls: Callable[..., nn.Module] = nn.Dense

  @nn.compact
  def __call__(self, x, _):
    block_cls = RematBlock if self.config.remat else Block
    return block_cls(self.config, self.dense_cls, name="block")(x), None


class Llama(nn.Module):
  """Llama-style decoder-only language model.

  Parameter tree (``params``), kernels are ``(in, out)``::

    embed/embedding                      (V, D)
    layers_{i}/attn_norm/scale           (D,)
    layers_{i}/attn/q_proj/kernel        (D, H*Dh)
    layers_{i}/attn/k_proj/kernel        (D, K*Dh)
    layers_{i}/attn/v_proj/kernel        (D, K*Dh)
    layers_{i}/attn/o_proj/kernel        (H*Dh, D)
    layers_{i}/mlp_norm/scale            (D,)
    layers_{i}/mlp/gate_proj/kernel      (D, F)
    layers_{i}/mlp/up_proj/kernel        (D, F)
    layers_{i}/mlp/down_proj/kernel      (F, D)
    norm/scale                           (D,)
    lm_head/kernel                       (D, V)  (absent if tie_embeddings)

  Attributes:
    config: Model config.
    dense_cls: Constructor used for the 7 attention/MLP projections of every
      block (not for ``lm_head``). Must accept the keyword arguments
      ``features, use_bias, dtype, param_dtype, kernel_init, name`` like
      :class:`flax.linen.Dense` and map ``(B, S, d_in) -> (B, S, features)``.
    head_cls: Constructor of the untied ``lm_head`` (same contract as
      ``dense_cls``; e.g. a ForgeDense with plain AdamW while the blocks
      fold). ``None``: :class:`flax.linen.Dense`. A tied model has no
      ``lm_head`` (its head is the embedding, updated unfused), so giving
      ``head_cls`` with ``tie_embeddings`` raises ``ValueError``.
    embed_cls: Constructor of the embedding. Must accept the keyword
      arguments ``num_embeddings, features, dtype, param_dtype,
      embedding_init, name`` like :class:`flax.linen.Embed` (and have
      ``attend`` for a tied model). ``None``: :class:`flax.linen.Embed`. A
      :class:`forge_jax.ForgeEmbed` with an optimizer updates the table in
      its backward pass (untied models only: its ``attend`` is refused in a
      fused step).
  """

  config: LlamaConfig
  dense_cls: Callable[..., nn.Module] = nn.Dense
  head_cls: Callable[..., nn.Module] | None = None
  embed_cls: Callable[..., nn.Module] | None = None

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    """Computes next-token logits.

    Args:
      tokens: int32 ``(B, S)`` token ids with ``S <= config.max_seq_len``.

    Returns:
      ``(B, S, V)`` logits in ``config.logits_dtype`` (float32 by default);
      position ``t`` depends only on
      ``tokens[:, :t + 1]``.

    Raises:
      ValueError: If ``tokens`` is not 2-D or is longer than
        ``max_seq_len``.
    """
    cfg = self.config
    if self.head_cls is not None and cfg.tie_embeddings:
      raise ValueError(
          "head_cls was given but config.tie_embeddings=True: a tied model has "
          "no lm_head (its logits come from the embedding matrix)")
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be (B, S), got shape {tokens.shape}")
    if tokens.shape[1] > cfg.max_seq_len:
      raise ValueError(f"sequence length {tokens.shape[1]} exceeds "
                       f"max_seq_len {cfg.max_seq_len}")

    embed_cls = nn.Embed if self.embed_cls is None else self.embed_cls
    embed = embed_cls(num_embeddings=cfg.vocab_size, features=cfg.d_model,
                      dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                      embedding_init=_normal(INIT_STD), name="embed")
    x = embed(tokens)

    if cfg.scan_layers:
      stack = nn.scan(_ScanStep, variable_axes={"params": 0, "forge_state": 0},
                      split_rngs={"params": True}, length=cfg.n_layers)
      if (dense_lib.current_context() is not None and not self.is_initializing()
          and "layers" in self.variables.get(dense_lib.FORGE_STATE, {})):
        x = self._fused_scanned_layers(x)
      else:
        x, _ = stack(cfg, self.dense_cls, name="layers")(x, None)
    else:
      block_cls = RematBlock if cfg.remat else Block
      for i in range(cfg.n_layers):
        x = block_cls(cfg, self.dense_cls, name=f"layers_{i}")(x)

    x = RMSNorm(eps=cfg.norm_eps, dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, name="norm")(x)
    if cfg.tie_embeddings:
      logits = embed.attend(x)
    else:
      head_cls = nn.Dense if self.head_cls is None else self.head_cls
      logits = head_cls(features=cfg.vocab_size, use_bias=False, dtype=cfg.dtype,
                        param_dtype=cfg.param_dtype,
                        kernel_init=_normal(INIT_STD), name="lm_head")(x)
    return logits.astype(cfg.logits_dtype)


  def _fused_scanned_layers(self, x: jax.Array) -> jax.Array:
    """The scanned blocks in a fused step, updated in place (inplace_scan).

    Under ``nn.scan`` the backward pass would collect every layer's new
    kernels and moments (the fused layers' cotangents) into a fresh stacked
    buffer beside the old one. Here the stacked ``layers/block`` variables
    are the carry of a reverse loop that runs block i's fused backward and
    writes block i's new values into slice i. With ``config.remat`` the loop
    recomputes block i's forward from its saved input (per-block
    rematerialization); without, the forward scan saves each block's
    matmul and attention outputs and the loop recomputes only the
    elementwise rest of the forward (``inplace_scan(..., remat=False)`` of
    the block under ``jax.checkpoint(policy=recompute_elementwise)``; the
    weights are read from the stack, not saved a second time).
    """
    cfg = self.config
    params = flax.core.unfreeze(self.variables["params"]["layers"]["block"])
    fstate = flax.core.unfreeze(
        self.variables[dense_lib.FORGE_STATE]["layers"]["block"])
    flat_p = flax.traverse_util.flatten_dict(params)
    flat_f = flax.traverse_util.flatten_dict(fstate)
    fused = {k[:-1] for k in flat_f if k[-1] == dense_lib.PROBE}
    diff, const = {}, {}
    for k, v in flat_p.items():
      if not (k[-1] == "kernel" and k[:-1] in fused):  # fed from forge_state
        diff[("params",) + k] = v
    for k, v in flat_f.items():
      # (an int8 QuantizedArray arrives as float8 codes and float32 scales)
      floating = all(jnp.issubdtype(jnp.result_type(a), jnp.floating)
                     for a in jax.tree.leaves(v))
      (diff if floating else const)[(dense_lib.FORGE_STATE,) + k] = v
    prefix = tuple(self.scope.path) + ("layers", "block")

    def body(h, d, c):
      flat = {**d, **c}
      for p in fused:  # the params copy is not used by a fused layer's matmul
        flat[("params",) + p + ("kernel",)] = flat[
            (dense_lib.FORGE_STATE,) + p + (dense_lib.KERNEL_INPUT,)]
      with dense_lib.path_prefix(prefix):
        return Block(cfg, self.dense_cls).apply(
            flax.traverse_util.unflatten_dict(flat), h)

    if not cfg.remat:
      # Save the matmul (and attention) outputs, recompute the elementwise
      # rest in the backward: a third of the residuals of saving everything.
      # prevent_cse=False: no optimization_barrier over the recomputation's
      # operands (slices of the stacks among them), as inplace_scan's remat.
      body = jax.checkpoint(body, policy=recompute_elementwise, prevent_cse=False)
    return inplace_scan(body, x, diff, const, remat=cfg.remat)


COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def tensor_parallel_specs(variables: Any, axis: str,
                          axis_size: int | None = None) -> Any:
  """PartitionSpecs of a Llama's variables for ``tensor_parallel_axis=axis``.

  The projections' kernels and everything stored beside them in
  ``forge_state`` (moments, int8 codes and scales, folded moments) are split
  like ``ForgeDense.kernel_axes``: q/k/v/gate/up along their last axis, o and
  down along their second to last (a scanned stack keeps its leading layer
  axis whole). Everything else (embedding, norms, scalars) is replicated.

  Args:
    variables: the model's variables, or their shapes (``jax.eval_shape``).
    axis: the mesh axis name.
    axis_size: the number of devices along ``axis``. When given, every split
      dimension is checked to divide evenly over them, so that a sharded
      ``jax.jit(model.init, out_shardings=...)`` cannot fail later with
      JAX's generic error about an indivisible shape.

  Returns:
    A tree of ``jax.sharding.PartitionSpec`` with the structure of
    ``variables``; use ``NamedSharding(mesh, spec)`` to place or init them.

  Raises:
    ValueError: if ``axis_size`` is not a positive int, or a split dimension
      is not a multiple of it, naming the variable; for an int8 state split
      along the axis of its quantization blocks (one scale per
      ``quantization.BLOCK_SIZE`` = 64 elements: column-parallel layers),
      if that axis is not a multiple of 64 × ``axis_size`` (each device
      needs whole blocks).
  """
  P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name
  if axis_size is not None and (isinstance(axis_size, bool) or not isinstance(
      axis_size, numbers.Integral) or axis_size < 1):
    raise ValueError(f"axis_size={axis_size!r} must be a positive int (the "
                     f"number of devices along {axis!r}) or None")

  def spec(path, leaf):
    names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
    nd = len(getattr(leaf, "shape", ()))
    if nd >= 2 and any(n in COLUMN_PARALLEL for n in names):
      return P(*([None] * (nd - 1)), axis)
    if nd >= 2 and any(n in ROW_PARALLEL for n in names):
      return P(*([None] * (nd - 2)), axis, None)
    return P()

  def check(path, leaf, leaf_spec, what="", multiple=1):
    if axis_size is None:
      return
    for dim, (n, a) in enumerate(zip(leaf.shape, leaf_spec)):
      if a is not None and n % (axis_size * multiple):
        why = (", which does not divide it" if multiple == 1 else
               f": int8 states keep one scale per block of {multiple} "
               "elements along this axis and each device needs whole "
               f"blocks, so the axis must be a multiple of "
               f"{multiple * axis_size}; use fewer devices or bf16/fp32 moments")
        raise ValueError(
            f"tensor_parallel_specs: {jax.tree_util.keystr(path)}{what} of "
            f"shape {tuple(leaf.shape)} splits its axis {dim} ({n}) over "
            f"{axis_size} devices of {axis!r}{why}")

  def node(path, leaf):  # an int8 state split like its codes
    if isinstance(leaf, quantization.QuantizedArray):
      out = quantization.sharded_like(leaf, spec(path, leaf.codes))
      entries = tuple(out.codes)  # blocks lie along the codes' last axis
      split_last = len(entries) == leaf.codes.ndim and entries[-1] is not None
      check(path, leaf.codes, out.codes, ".codes",
            quantization.BLOCK_SIZE if split_last else 1)
      check(path, leaf.scale, out.scale, ".scale")
      return out
    out = spec(path, leaf)
    check(path, leaf, out)
    return out

  return jax.tree_util.tree_map_with_path(
      node, variables,
      is_leaf=lambda x: isinstance(x, quantization.QuantizedArray))


@jax.custom_vjp
def _token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
  return _token_losses_fwd(logits, targets)[0]


def _token_losses_fwd(logits, targets):
  # Negative ids count from the end, as take_along_axis (and optax) read
  # them; the backward's one-hot must pick the same column.
  targets = jnp.where(targets < 0, targets + logits.shape[-1], targets)
  lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return lse - target_logit.astype(jnp.float32), (logits, targets, lse)


def _token_losses_bwd(residuals, g):
  logits, targets, lse = residuals
  # softmax - onehot in fp32, computed elementwise and written once in the
  # logits' dtype: no fp32 (..., V) array is kept from the forward pass.
  probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
  onehot = jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)
  dlogits = ((probs - onehot) * g[..., None]).astype(logits.dtype)
  # Integer targets: their cotangent is float0.
  return dlogits, np.zeros(targets.shape, jax.dtypes.float0)


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


def cross_entropy_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy, -log softmax(logits)[target].

  The softmax is computed in float32 whatever the logits' dtype; the
  backward pass keeps only the logits themselves (in their own dtype) and
  per-position log-sum-exps, and writes the logits' gradient once, in the
  logits' dtype. With bf16 logits (``LlamaConfig.logits_dtype``) no fp32
  ``(..., V)`` array is stored: for Llama-3.1-8B at 2048 tokens each such
  array is 1 GiB. Equals ``optax.softmax_cross_entropy_with_integer_labels``
  on the float32-cast logits, and its gradient, to float32 rounding.

  Reverse-mode only (a ``jax.custom_vjp``): ``jax.grad``, ``jax.hessian``
  and forward-over-reverse work; ``jax.jvp`` / ``jax.jacfwd`` of the loss do
  not (use optax's loss for those).

  Args:
    logits: ``(..., V)`` logits of any float dtype.
    targets: int ``(...)`` target ids in ``[0, V)`` (negative ids count from
      the end, as in optax), same leading shape as ``logits``.

  Returns:
    float32 scalar: mean over all target positions.

  Raises:
    ValueError: If the shapes do not match or ``targets`` is not integer.
  """
  if logits.shape[:-1] != targets.shape:
    raise ValueError(f"targets must have shape logits.shape[:-1] = "
                     f"{logits.shape[:-1]}, got {targets.shape}")
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"targets must be integer ids, got dtype {targets.dtype}")
  return jnp.mean(_token_losses(logits, targets))

"""int8 absmax block quantization of optimizer state (block size 64).

An optimizer-state array of shape (..., n) is stored as a :class:`QuantizedArray`:
int8 ``codes`` of the same shape and one fp32 ``scale`` per block of
``BLOCK_SIZE`` = 64 consecutive elements along the last axis, shape
(..., ceil(n / 64)); the last block of a row may be partial. A 0-d array is
one block (codes and scale both 0-d). Blocks never cross rows, so a kernel
tile whose width is a multiple of 64 holds whole blocks.

Two codes, chosen by the state's sign:

* **signed** (first moments ``mu``, momentum ``trace``): linear absmax,
  ``scale = max|x| / 127``, ``code = round(x / scale)`` in [-127, 127],
  ``x ≈ code * scale``.
* **non-negative** (second moments ``nu``, AdaGrad's ``sum_of_squares``):
  the *square root* is quantized linearly, ``r = sqrt(x)``,
  ``scale = max r / 255``, ``code = round(r / scale) - 128`` in [-128, 127],
  ``x ≈ ((code + 128) * scale)²``. This is a linear code of Adam's
  denominator sqrt(nu): a value 10⁻² of its block's maximum is kept within
  5% and one of 10⁻⁴ within a factor of 2 (code 3 of 255), where a linear
  code of nu gives 0 below 1/254 of the maximum. A positive value never
  decodes to zero (its code is at least 1 above the zero code): an Adam
  denominator that decoded to 0 would turn the step into mu / eps.

An all-zero block has scale 0, codes 0 (signed) or -128 (non-negative) and
decodes to exact zeros, without NaN; so does a signed block whose absmax is
below 1e-30 (where 127 / absmax would overflow). Subnormal values (below
1.2e-38) may decode to 0 in either code. One inf or NaN makes its whole block
of 64 inf or NaN. Rounding is to nearest (ties away from
zero in the magnitude), the same arithmetic in the XLA reference and in the
kernel epilogues: the Triton kernel calls :func:`quantize_blocks` and
:func:`dequantize_blocks` on (rows, blocks, 64) views of its tile, the Mosaic
kernel on (rows, 64) sub-tiles (bitwise equal on finite values, but where
that jax's Mosaic GPU has no sqrt (0.10), whose replacement x·rsqrt(x) may
be an ulp away).

**Scale layout.** The scales of an array of two or more axes may be stored
transposed in their last two axes (``QuantizedArray.scale_transposed``):
(..., ceil(n / 64), m) for codes (..., m, n). The values are the same; only
the storage order differs. ``ForgeDense`` keeps its kernels' int8 moments
that way because it is the Mosaic GPU kernel's own layout (a sub-tile's
scales are one contiguous row, loaded by TMA; see ``kernel_mosaic``):
with the natural layout every call transposed the scales in and out, and
under ``lax.scan`` XLA transposed whole layer stacks of them (160 MiB of
temp in the Llama-3.1-8B step at T=2048, stop 26's peak report).

The quantized tree also appears with its codes viewed as ``float8_e4m3fn``
(:func:`as_float_view`): the fused step returns new states as cotangents,
which JAX allows for floating-point arrays only. The view is a bitcast; no
float8 arithmetic ever touches it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

BLOCK_SIZE = 64
"""Elements per quantization block, along the last axis."""

CODE_DTYPE = jnp.dtype(jnp.int8)
VIEW_DTYPE = jnp.dtype(jnp.float8_e4m3fn)
_SIGNED_MAX = 127.0
_NONNEG_LEVELS = 255.0
_NONNEG_OFFSET = 128.0
_TINY = 1e-30  # a signed block whose absmax is below this is stored as zeros


@dataclasses.dataclass(frozen=True)
class QuantizedArray:
  """An fp32 array stored as int8 codes and one fp32 scale per 64-block.

  Attributes:
    codes: int8, the array's shape (..., n) (or (..., m, n)).
    scale: float32, (..., ceil(n / 64)); () for a 0-d array. With
      ``scale_transposed``: (..., ceil(n / 64), m), the same scales with
      their last two axes swapped.
    nonnegative: static; True for the square-root code of non-negative
      states (see the module docstring), False for the signed linear code.
    scale_transposed: static; the scale layout (module docstring); needs
      codes of at least two axes.
  """

  codes: jax.Array
  scale: jax.Array
  nonnegative: bool = False
  scale_transposed: bool = False

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.codes.shape)

  @property
  def nbytes(self) -> int:
    """Bytes stored: one per code plus four per scale."""
    return int(math.prod(self.codes.shape)) + 4 * int(math.prod(self.scale.shape))


jax.tree_util.register_dataclass(
    QuantizedArray, data_fields=["codes", "scale"],
    meta_fields=["nonnegative", "scale_transposed"])


def num_blocks(n: int) -> int:
  """Blocks in a row of ``n`` elements: ceil(n / 64)."""
  return -(-n // BLOCK_SIZE)


def scale_shape(shape: tuple[int, ...],
                scale_transposed: bool = False) -> tuple[int, ...]:
  """Shape of the scales of an array of ``shape`` (in the transposed layout
  with ``scale_transposed``).

  Raises:
    ValueError: ``scale_transposed`` for a shape of fewer than two axes.
  """
  shape = tuple(shape)
  if scale_transposed:
    _check_transposable(shape)
    return shape[:-2] + (num_blocks(shape[-1]), shape[-2])
  if not shape:
    return ()
  return shape[:-1] + (num_blocks(shape[-1]),)


def _check_transposable(shape) -> None:
  if len(shape) < 2:
    raise ValueError(f"scale_transposed=True needs an array of at least two "
                     f"axes, got shape {tuple(shape)}")


def natural_scale(q: QuantizedArray) -> jax.Array:
  """``q``'s scales in the natural layout, (..., ceil(n / 64))."""
  return jnp.swapaxes(q.scale, -1, -2) if q.scale_transposed else q.scale


def sharded_like(state, spec):
  """The ``PartitionSpec`` (tree) of ``state`` split as an array with
  ``spec``: ``spec`` itself for a plain array; for a QuantizedArray, its
  codes split by ``spec``, its scales too (blocks lie along the last axis,
  so a split of that axis splits the blocks), or with the last two entries
  swapped when they are stored transposed."""
  if not isinstance(state, QuantizedArray):
    return spec
  scale = spec
  if state.scale_transposed:
    entries = (*spec, *([None] * (state.codes.ndim - len(spec))))
    scale = jax.sharding.PartitionSpec(*entries[:-2], entries[-1], entries[-2])
  return QuantizedArray(spec, scale, state.nonnegative, state.scale_transposed)


def with_scale_layout(q: QuantizedArray, scale_transposed: bool) -> QuantizedArray:
  """``q`` with its scales stored in the given layout (the same values)."""
  if q.scale_transposed == scale_transposed:
    return q
  if scale_transposed:
    _check_transposable(q.codes.shape)
  return QuantizedArray(q.codes, jnp.swapaxes(q.scale, -1, -2), q.nonnegative,
                        scale_transposed)


def has_nan(xb: jax.Array) -> jax.Array:
  """Per block of ``xb`` (..., 64): does it hold a NaN? A max reduction of
  0/1 flags, because a max of the values themselves may skip NaN (XLA's CPU
  reduction of many blocks, Triton's maxnum)."""
  return jnp.max(jnp.where(xb != xb, 1.0, 0.0), axis=-1) > 0


def _per_block(v, like):
  """Per-block values ``v`` (...) broadcast over the blocks ``like`` (..., 64)."""
  return lax.broadcast_in_dim(v, like.shape, tuple(range(v.ndim)))


def _round_half_up(y):
  """floor(y + 0.5) for y >= 0 (its truncation to int32, the same value for
  the y <= 255.5 met here; Mosaic GPU lowers this but not floor)."""
  return (y + 0.5).astype(jnp.int32).astype(jnp.float32)


def quantize_blocks(xb: jax.Array, nonnegative: bool, sqrt=jnp.sqrt):
  """Codes (fp32-valued integers) and scales of fp32 blocks ``xb`` (..., 64).

  Elements that do not belong to the array (padding, masked kernel lanes)
  must be 0. Returns ``(codes, scale)`` with shapes (..., 64) and (...). A
  block holding a NaN gets a NaN scale (it decodes to NaN). Written in
  operations that XLA, the Triton and the Mosaic GPU kernels all lower (the
  Mosaic kernel calls it on (rows, 64) sub-tiles, one block per row, and may
  pass its own ``sqrt`` where Mosaic GPU has none).
  """
  if nonnegative:
    r = sqrt(jnp.maximum(xb, 0.0))
    top = jnp.where(has_nan(xb), jnp.nan, jnp.max(r, axis=-1))
    inv = jnp.where(top > 0, _NONNEG_LEVELS / jnp.where(top > 0, top, 1.0), 0.0)
    c = jnp.minimum(_round_half_up(r * _per_block(inv, xb)), _NONNEG_LEVELS)
    c = jnp.where(r > 0, jnp.maximum(c, 1.0), c)  # positive stays positive
    return c - _NONNEG_OFFSET, top / _NONNEG_LEVELS
  top = jnp.max(jnp.abs(xb), axis=-1)
  # 127 / top overflows below ~4e-37: such blocks (and subnormal ones) are
  # stored as zeros; a block with a NaN keeps a NaN scale.
  top = jnp.where(has_nan(xb), jnp.nan, jnp.where(top < _TINY, 0.0, top))
  inv = jnp.where(top > 0, _SIGNED_MAX / jnp.where(top > 0, top, 1.0), 0.0)
  c = jnp.minimum(_round_half_up(jnp.abs(xb) * _per_block(inv, xb)), _SIGNED_MAX)
  return jnp.where(xb < 0, -c, c), top / _SIGNED_MAX


def dequantize_blocks(codes: jax.Array, scale: jax.Array,
                      nonnegative: bool) -> jax.Array:
  """fp32 values of ``codes`` (..., 64) (any real dtype) with ``scale`` (...)."""
  c = codes.astype(jnp.float32)
  scale = _per_block(scale, c)
  if nonnegative:
    r = (c + _NONNEG_OFFSET) * scale
    return r * r
  return c * scale


def _blocked(x: jax.Array) -> jax.Array:
  """(..., n) -> (..., nb, 64), zero-padded."""
  n = x.shape[-1]
  pad = num_blocks(n) * BLOCK_SIZE - n
  if pad:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
  return x.reshape(x.shape[:-1] + (-1, BLOCK_SIZE))


def quantize(x: jax.Array, nonnegative: bool = False,
             scale_transposed: bool = False) -> QuantizedArray:
  """Quantizes an fp32 (or any float) array; see the module docstring.

  Args:
    x: array of any shape, 0-d included.
    nonnegative: use the square-root code (x must be >= 0; negative values
      are clamped to 0).
    scale_transposed: store the scales in the transposed layout (x of at
      least two axes).

  Returns:
    A :class:`QuantizedArray` of ``x``'s shape.

  Raises:
    ValueError: ``scale_transposed`` with fewer than two axes.
  """
  x = jnp.asarray(x, jnp.float32)
  shape = x.shape
  if scale_transposed:
    _check_transposable(shape)
  if x.size == 0:
    return QuantizedArray(jnp.zeros(shape, CODE_DTYPE),
                          jnp.zeros(scale_shape(shape, scale_transposed),
                                    jnp.float32), nonnegative, scale_transposed)
  flat = x.reshape(1) if x.ndim == 0 else x
  n = flat.shape[-1]
  codes, scale = quantize_blocks(_blocked(flat), nonnegative)
  codes = codes.reshape(flat.shape[:-1] + (-1,))[..., :n]
  q = QuantizedArray(codes.astype(CODE_DTYPE).reshape(shape),
                     scale.reshape(scale_shape(shape)), nonnegative)
  return with_scale_layout(q, scale_transposed)


def dequantize(q: QuantizedArray) -> jax.Array:
  """The fp32 array a :class:`QuantizedArray` stands for."""
  shape = q.codes.shape
  if q.codes.size == 0:
    return jnp.zeros(shape, jnp.float32)
  codes = q.codes.reshape(1) if not shape else q.codes
  n = codes.shape[-1]
  scale = natural_scale(q).reshape(codes.shape[:-1] + (num_blocks(n),))
  c = _blocked(codes.astype(jnp.float32))  # padding lanes are cut off below
  x = dequantize_blocks(c, scale, q.nonnegative)
  return x.reshape(x.shape[:-2] + (-1,))[..., :n].reshape(shape)


def as_float_view(x):
  """int8 codes -> the same bits as float8_e4m3fn (other leaves unchanged)."""
  return jax.tree.map(
      lambda a: lax.bitcast_convert_type(a, VIEW_DTYPE)
      if jnp.result_type(a) == CODE_DTYPE else a, x)


def from_float_view(x):
  """Inverse of :func:`as_float_view`."""
  return jax.tree.map(
      lambda a: lax.bitcast_convert_type(a, CODE_DTYPE)
      if jnp.result_type(a) == VIEW_DTYPE else a, x)


# ---------------------------------------------------------------------------
# Optimizer-state storage: fp32, bf16 or int8 (a QuantizedArray).

STATE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), CODE_DTYPE)


def state_dtype(name: str, dtype) -> jnp.dtype:
  """Validates a state storage dtype (None -> float32).

  Raises:
    ValueError: naming ``name`` unless ``dtype`` is float32, bfloat16 or int8.
  """
  if dtype is None:
    return jnp.dtype(jnp.float32)
  try:
    d = jnp.dtype(dtype)
  except TypeError:
    d = None
  if d not in STATE_DTYPES:
    raise ValueError(f"{name}={dtype!r} must be one of float32, bfloat16, int8 "
                     "(int8: absmax blocks of 64 with an fp32 scale each)")
  return d


def full_state(shape, value: float, dtype, nonnegative: bool,
               scale_transposed: bool = False):
  """A state array of ``shape`` filled with ``value``, stored as ``dtype``.

  Built at its stored size: no fp32 array of ``shape`` is made on the way
  (eager initialization of the int8 moments of an 8B model would otherwise
  hold an fp32 copy of the largest leaf). The result is
  ``quantize(jnp.full(shape, value), nonnegative)`` for int8 (every block,
  a padded last one included, quantizes a constant to the same code and
  scale; the scale may differ from that of a compiled ``quantize`` of the
  whole array by 1 ulp, how XLA compiles absmax / 127), its scales in the
  transposed layout with ``scale_transposed`` (int8 only; ignored for the
  other dtypes), and
  ``jnp.full(shape, value, float32).astype(dtype)`` otherwise (empty and
  0-d shapes included).
  """
  shape = tuple(shape)
  with jax.ensure_compile_time_eval():  # a constant stays one under jit
    value = jnp.asarray(value, jnp.float32)
  if jnp.dtype(dtype) == CODE_DTYPE:
    # One block, quantized while tracing when ``value`` is a constant: a
    # jitted init of many int8 leaves then holds two broadcasts per leaf, not
    # a quantization's ops (at Llama-3.1-8B's 225 fused kernels those ops
    # made up 83% of the init's HLO lines).
    with jax.ensure_compile_time_eval():
      one = quantize(jnp.full((BLOCK_SIZE,), value), nonnegative)
      code, scale = one.codes[0], one.scale[0]
    return QuantizedArray(
        jnp.full(shape, code, CODE_DTYPE),
        jnp.full(scale_shape(shape, scale_transposed), scale, jnp.float32),
        nonnegative, scale_transposed)
  return jnp.full(shape, value.astype(dtype), dtype)


def state_to_f32(s) -> jax.Array:
  """A stored state (array or QuantizedArray) as fp32."""
  if isinstance(s, QuantizedArray):
    return dequantize(s)
  return jnp.asarray(s).astype(jnp.float32)


def state_from_f32(x: jax.Array, like):
  """fp32 ``x`` stored like ``like`` (its dtype, or quantized like it)."""
  if isinstance(like, QuantizedArray):
    return quantize(x, like.nonnegative, like.scale_transposed)
  return x.astype(like.dtype)


def any_quantized(states) -> bool:
  """Whether any of ``states`` is a :class:`QuantizedArray`."""
  return any(isinstance(s, QuantizedArray) for s in states)


def state_storage_dtype(s) -> jnp.dtype:
  """float32, bfloat16 or int8 (for a QuantizedArray)."""
  return CODE_DTYPE if isinstance(s, QuantizedArray) else jnp.dtype(s.dtype)

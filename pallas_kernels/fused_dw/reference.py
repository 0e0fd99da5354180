"""Pure-jnp reference of the fused weight-gradient + optimizer-update op."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import precision
from pallas_kernels import quantization


def weight_grad_reference(x: jax.Array, dy: jax.Array,
                          dtype=jnp.float32) -> jax.Array:
  """dW = xᵀ·dY at full precision: (T, in), (T, out) -> (in, out), the
  matmul's result in ``dtype`` (fp32 by default)."""
  return lax.dot_general(
      x, dy, (((0,), (0,)), ((), ())),
      precision=lax.Precision.HIGHEST,
      preferred_element_type=dtype)


def as_uint32(v) -> jax.Array:
  """An integer scalar (a Python/NumPy int below 2**32, or an array) as uint32."""
  if isinstance(v, (int, np.integer)):
    return jnp.asarray(v, jnp.uint32)
  return jnp.asarray(v).astype(jnp.uint32)


def element_index(rows, cols, row0, col0, width: int) -> jax.Array:
  """Global row-major indices ``(row0 + rows) * width + col0 + cols``, uint32.

  ``rows`` (m,) and ``cols`` (n,) are local indices of a block (a kernel
  tile, or a whole W that is one shard of a wider weight) -> (m, n). The
  kernel and the reference both draw stochastic-rounding bits from these.
  """
  return ((rows.astype(jnp.uint32) + row0)[:, None] * jnp.uint32(width)
          + (cols.astype(jnp.uint32) + col0)[None, :])


def round_weight(new_w: jax.Array, dtype, seed: jax.Array | None,
                 count: jax.Array, index: jax.Array) -> jax.Array:
  """Casts the fp32 new weight to ``dtype``: stochastically when ``seed``.

  ``index`` holds the global row-major element indices of ``new_w``, so that
  the kernel (one tile) and the reference (the whole array) draw the same
  random bits for the same element.
  """
  if seed is None or dtype == jnp.float32:
    return new_w.astype(dtype)
  bits = precision.random_bits(seed, count.astype(jnp.uint32), index)
  return precision.stochastic_round_to_bf16(new_w, bits)


def fused_dw_update_reference(
    x: jax.Array,
    dy: jax.Array,
    w: jax.Array,
    state: Sequence[jax.Array],
    hparams: jax.Array,
    *,
    rule,
    seed: jax.Array | None = None,
    index_offset=(0, 0),
    index_width: int | None = None,
    grad_dtype=jnp.float32,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """The fused op computed unfused: dW materialized, then ``rule.update``.

  Same arguments and results as :func:`pallas_kernels.fused_dw.fused_dw_update`,
  plus ``grad_dtype``: the dtype dW is materialized in between, float32 (the
  default: what the fused kernel computes, so this is the op's reference) or
  bfloat16 (a matmul whose result is bf16, as the backward of an unfused
  step with bf16 parameters such as ``optax.adamw``'s makes its gradient,
  then the same update, which reads it as fp32: a timing baseline built as
  that step is, not bitwise the fused op; stop 40 estimated from the 8B
  model's kernel sums that that step's dW and update take less time than
  the fp32 baseline does per op). Under jit XLA may keep that bf16 result in
  fp32 where it allows excess precision, as it may in the step this mimics
  (seen on the CPU). A dtype, given as a string ('float32', 'bfloat16'), a
  NumPy dtype or a scalar type (``jnp.bfloat16``).

  Raises:
    ValueError: if ``grad_dtype`` is not a dtype, or one other than float32
      and bfloat16 (an array, None or a Python number type included).
  """
  name = None
  if (isinstance(grad_dtype, (str, np.dtype)) or (
      isinstance(grad_dtype, type) and grad_dtype not in (bool, int, float, complex))):
    try:
      name = jnp.dtype(grad_dtype).name
    except TypeError:
      pass
  if name not in ("float32", "bfloat16"):
    shown = name if name is not None else (
        f"an array of {grad_dtype.dtype}" if hasattr(grad_dtype, "dtype")
        and not isinstance(grad_dtype, type) else repr(grad_dtype))
    raise ValueError(f"grad_dtype={shown} must be a dtype, float32 or bfloat16")
  # bf16: with bf16 x and dY the dot's default result type, as a bf16
  # backward's; the update reads it as fp32.
  grad = weight_grad_reference(x, dy, jnp.dtype(name)).astype(jnp.float32)
  hp, count = rule.unpack(hparams)
  new_w, new_state = rule.update_masked(
      grad, w.astype(jnp.float32),
      tuple(quantization.state_to_f32(s) for s in state), hp, count)
  index = element_index(
      lax.iota(jnp.uint32, w.shape[0]), lax.iota(jnp.uint32, w.shape[1]),
      *map(as_uint32, index_offset),
      w.shape[1] if index_width is None else index_width)
  if seed is not None:
    seed = as_uint32(seed)  # a Python int seed may exceed int32
  return (round_weight(new_w, w.dtype, seed, count, index),
          tuple(quantization.state_from_f32(n, s)
                for n, s in zip(new_state, state)))

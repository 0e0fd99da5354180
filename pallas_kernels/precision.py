"""Stochastic rounding fp32 -> bf16 with counter-based random bits.

Writing a bf16 weight updated in fp32 with round-to-nearest loses every
update smaller than half a bf16 ULP (1.0 + 1e-4 stays 1.0 forever).
Stochastic rounding rounds up with probability equal to the discarded
fraction, so the rounded value is unbiased and small updates accumulate in
expectation (FORGE, arXiv 2606.22932, low-precision section).

The random bits come from an integer hash of (seed, step, element index),
not from ``jax.random``: the same code runs in a Pallas Triton kernel
epilogue (uint32 multiply, xor and shifts lower there), and the result is
deterministic for a seed and independent of how the array is tiled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_U32 = jnp.uint32


def _mix32(h: jax.Array) -> jax.Array:
  """A 32-bit avalanche mix (the 'lowbias32' constants of C. Wellons)."""
  h = h ^ (h >> 16)
  h = h * _U32(0x7FEB352D)
  h = h ^ (h >> 15)
  h = h * _U32(0x846CA68B)
  return h ^ (h >> 16)


def random_bits(seed: jax.Array, step: jax.Array, index: jax.Array) -> jax.Array:
  """uint32 pseudo-random bits for each element ``index`` at ``step``.

  Args:
    seed: uint32 (or int) scalar, the stream's seed.
    step: uint32 (or int) scalar, the step count.
    index: uint32 (or int) array of global element indices (row * cols + col).

  Returns:
    A uint32 array shaped like ``index``; a function of the three values only.
  """
  key = _mix32(_mix32(jnp.asarray(seed).astype(_U32) ^ _U32(0x9E3779B9))
               ^ jnp.asarray(step).astype(_U32))
  return _mix32(jnp.asarray(index).astype(_U32) * _U32(0x9E3779B1) ^ key)


def stochastic_round_to_bf16(x: jax.Array, bits: jax.Array) -> jax.Array:
  """Rounds fp32 ``x`` to bf16, up with probability of the discarded fraction.

  The low 16 bits of ``x`` (those bf16 drops) get the low 16 bits of ``bits``
  added before truncation: a carry into bit 16 happens with probability
  (low bits) / 2^16, which makes E[result] = x for either sign (the
  magnitude is rounded, and the sign bit is untouched). Values exactly
  representable in bf16 (low bits zero) are returned unchanged, and inf and
  NaN pass through. A finite value within one bf16 ULP of the largest bf16
  may round to inf, as round-to-nearest would for slightly larger values.

  Args:
    x: float32 array.
    bits: uint32 array of x's shape (see :func:`random_bits`).

  Returns:
    A bfloat16 array of x's shape.

  Raises:
    ValueError: if ``x`` is not float32 or ``bits`` not uint32 of its shape.
  """
  if x.dtype != jnp.float32:
    raise ValueError(f"x.dtype={x.dtype} must be float32")
  if bits.dtype != _U32 or bits.shape != x.shape:
    raise ValueError(f"bits must be uint32 of shape {x.shape}, got "
                     f"{bits.dtype}{list(bits.shape)}")
  u = lax.bitcast_convert_type(x, _U32)
  finite = (u & _U32(0x7F800000)) != _U32(0x7F800000)
  rounded = (u + (bits & _U32(0xFFFF))) & _U32(0xFFFF0000)
  u = jnp.where(finite, rounded, u)
  # The low 16 bits are now zero (or x is inf/NaN): the cast is exact.
  return lax.bitcast_convert_type(u, jnp.float32).astype(jnp.bfloat16)


def stochastic_round_array(x: jax.Array, seed, step) -> jax.Array:
  """:func:`stochastic_round_to_bf16` of a whole array, indexed row-major."""
  index = lax.iota(_U32, x.size).reshape(x.shape)
  return stochastic_round_to_bf16(x, random_bits(seed, step, index))

"""Pure-jnp reference of the fused weight-gradient + optimizer-update op."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax


def weight_grad_reference(x: jax.Array, dy: jax.Array) -> jax.Array:
  """dW = xᵀ·dY in fp32 at full precision: (T, in), (T, out) -> (in, out)."""
  return lax.dot_general(
      x, dy, (((0,), (0,)), ((), ())),
      precision=lax.Precision.HIGHEST,
      preferred_element_type=jnp.float32)


def fused_dw_update_reference(
    x: jax.Array,
    dy: jax.Array,
    w: jax.Array,
    state: Sequence[jax.Array],
    hparams: jax.Array,
    *,
    rule,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """The fused op computed unfused: dW materialized, then ``rule.update``.

  Same arguments and results as :func:`pallas_kernels.fused_dw.fused_dw_update`.
  """
  grad = weight_grad_reference(x, dy)
  hp, count = rule.unpack(hparams)
  new_w, new_state = rule.update(
      grad, w.astype(jnp.float32),
      tuple(s.astype(jnp.float32) for s in state), hp, count)
  return (new_w.astype(w.dtype),
          tuple(n.astype(s.dtype) for n, s in zip(new_state, state)))

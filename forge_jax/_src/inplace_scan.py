"""A scan over stacked layers whose backward pass writes in place.

Under ``lax.scan`` the cotangents of stacked per-layer inputs (weights, and in
a fused step the *new* kernels and moments that fused layers return as
cotangents) are collected into a fresh stacked buffer, so the backward pass
holds the old stack and the new one at once: a temp of the full size of the
stacked weights and states ("the gradient floor" of scanned models).

:func:`inplace_scan` computes the same function, but its backward is a
reverse ``fori_loop`` whose carry *is* the stacked input: step i reads layer
i's slice (still the old values: layers below i have not been visited),
recomputes layer i's forward from its saved input (per-layer
rematerialization), takes the VJP, and writes layer i's cotangent into slice
i with ``dynamic_update_slice``. XLA updates a while-loop carry in place, and
the carry starts as the (donated) stacked input, so no second stack exists.

``forge_jax.models.llama`` uses it for its scanned blocks in a fused step; a
model of your own does the same by applying its block functionally::

    def body(h, d, c):        # d: the block's float variables, c: the others
      return Block(...).apply(merge(d, c), h)
    h = fj.inplace_scan(body, h, stacked_float_vars, stacked_other_vars)

(see ``Llama._fused_scanned_layers`` for the bookkeeping of a fused step:
fused kernels fed from ``forge_state`` and ``dense.path_prefix``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def inplace_scan(body: Callable[[Any, Any, Any], Any], carry: Any, diff: Any,
                 const: Any) -> Any:
  """``carry = body(carry, diff[i], const[i])`` for i = 0 .. n-1; returns it.

  Args:
    body: ``(carry, diff_i, const_i) -> carry`` (same structure, shapes and
      dtypes), a pure function; traced once forward and once backward.
    carry: the initial carry (e.g. activations (B, S, D)).
    diff: pytree of floating arrays with a leading layer axis n (stacked
      weights and states); differentiated.
    const: pytree of arrays with the same leading axis, not differentiated
      (e.g. uint32 rounding seeds); its cotangent is zero.

  Returns:
    The final carry. Its VJP returns the cotangent of ``carry`` and, for
    ``diff``, the stacked per-layer cotangents, written layer by layer into
    the buffer that held ``diff`` (in place when ``diff`` is not used again).
    The forward saves only each layer's input carry (n copies, as
    ``jax.checkpoint`` per layer does).

  ``body`` may close over arrays (``jax.closure_convert``): a closed-over
  value that is differentiated (e.g. a scale shared by every layer) gets
  its cotangent summed over the layers.

  Memory: the loop writes each layer's cotangent into the stack in place
  when the new values come from an opaque producer (the fused Pallas
  kernel). When they are computed by fusible XLA ops that read several
  stacks (the XLA reference of AdamW: the new kernel reads the old
  moments), XLA on the CPU was seen to duplicate that computation into the
  in-place update and copy a moment stack (fp32 moments: 0.73 of the stack
  as temp where ``lax.scan`` needs 1.17; bf16 moments: 0.27).

  Raises:
    ValueError: if a leaf of ``diff`` is not floating, a leaf of ``const``
      is (it would silently get no gradient), the leading axes differ, or
      there are no layers.
  """
  leaves = jax.tree.leaves((diff, const))
  if not leaves:
    raise ValueError("inplace_scan: diff and const hold no arrays")
  n = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
  if len(n) != 1 or None in n:
    raise ValueError(f"inplace_scan: every leaf of diff and const needs the "
                     f"same leading (layer) axis, got {sorted(map(str, n))}")
  if 0 in n:
    raise ValueError("inplace_scan: the layer axis is empty (0 layers)")
  for a in jax.tree.leaves(diff):
    if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
      raise ValueError(f"inplace_scan: diff leaves must be floating, got "
                       f"{jnp.result_type(a)}; pass it in const")
  for a in jax.tree.leaves(const):
    if jnp.issubdtype(jnp.result_type(a), jnp.inexact):
      raise ValueError(
          f"inplace_scan: const leaves get no gradient, so they may not be "
          f"floating (got {jnp.result_type(a)}); pass it in diff")
  # Values the body closes over (e.g. a shared scale under jax.grad) become
  # explicit arguments, so their cotangents can be returned (summed over
  # the layers); closed-over values that are not differentiated pass too.
  first = lambda a: a[0]  # noqa: E731
  converted, consts = jax.closure_convert(
      body, carry, jax.tree.map(first, diff), jax.tree.map(first, const))
  return _scan(converted, carry, diff, const, tuple(consts))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan(body, carry, diff, const, consts):
  def step(c, xs):
    return body(c, *xs, *consts), None
  return lax.scan(step, carry, (diff, const))[0]


def _scan_fwd(body, carry, diff, const, consts):
  def step(c, xs):
    return body(c, *xs, *consts), c
  out, inputs = lax.scan(step, carry, (diff, const))
  return out, (inputs, diff, const, consts)


def _zero_cotangent(a):
  if jnp.issubdtype(jnp.result_type(a), jnp.inexact):
    return jnp.zeros_like(a)
  return np.zeros(np.shape(a), jax.dtypes.float0)


def _scan_bwd(body, res, g):
  inputs, diff, const, consts = res
  n = jax.tree.leaves((diff, const))[0].shape[0]
  float_consts = [jnp.issubdtype(jnp.result_type(a), jnp.inexact) for a in consts]

  def step(j, state):
    i = n - 1 - j
    g, acc, consts_ct = state
    take = lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False)  # noqa: E731
    c_i = jax.tree.map(take, inputs)
    d_i = jax.tree.map(take, acc)
    k_i = jax.tree.map(take, const)
    fl = [a for a, f in zip(consts, float_consts) if f]

    def layer(c, d, fl):
      it = iter(fl)
      return body(c, d, k_i, *[next(it) if f else a
                               for a, f in zip(consts, float_consts)])

    _, vjp = jax.vjp(layer, c_i, d_i, fl)
    g_c, g_d, g_fl = vjp(g)
    # Slice i of the stack is written only now, after everything of layer i
    # has been read: the carry is updated in place.
    acc = jax.tree.map(
        lambda a, u: lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), i, 0),
        acc, g_d)
    return g_c, acc, [a + b for a, b in zip(consts_ct, g_fl)]

  init_ct = [jnp.zeros_like(a) for a, f in zip(consts, float_consts) if f]
  g, acc, fl_ct = lax.fori_loop(0, n, step, (g, diff, init_ct))
  it = iter(fl_ct)
  consts_ct = tuple(next(it) if f else _zero_cotangent(a)
                    for a, f in zip(consts, float_consts))
  const_ct = jax.tree.map(_zero_cotangent, const)
  return g, acc, const_ct, consts_ct


_scan.defvjp(_scan_fwd, _scan_bwd)

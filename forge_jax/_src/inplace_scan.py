"""A scan over stacked layers whose backward pass writes in place.

Under ``lax.scan`` the cotangents of stacked per-layer inputs (weights, and in
a fused step the *new* kernels and moments that fused layers return as
cotangents) are collected into a fresh stacked buffer, so the backward pass
holds the old stack and the new one at once: a temp of the full size of the
stacked weights and states ("the gradient floor" of scanned models).

:func:`inplace_scan` computes the same function, but its backward is a
reverse ``fori_loop`` whose carry *is* the stacked input: step i reads layer
i's slice (still the old values: layers below i have not been visited),
rebuilds layer i's VJP from what the forward saved for it (its input carry,
whose forward it recomputes: per-layer rematerialization; or, with
``remat=False``, its carry-dependent residuals) and from the slice, applies
it, and writes layer i's cotangent into slice i with
``dynamic_update_slice``. XLA updates a while-loop carry in place, and the
carry starts as the (donated) stacked input, so no second stack exists.

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
from jax.extend import core as _core

# dce_jaxpr: JAX's own dead-code elimination of a jaxpr, internal but the same
# signature on jax 0.10 and 0.11.
from jax._src.interpreters import partial_eval as _pe

_Literal = _core.Literal


def inplace_scan(body: Callable[[Any, Any, Any], Any], carry: Any, diff: Any,
                 const: Any, *, remat: bool = True) -> Any:
  """``carry = body(carry, diff[i], const[i])`` for i = 0 .. n-1; returns it.

  Args:
    body: ``(carry, diff_i, const_i) -> carry`` (same structure, shapes and
      dtypes), a pure function; traced once, with its VJP, for the forward
      and backward loops.
    carry: the initial carry (e.g. activations (B, S, D)).
    diff: pytree of floating arrays with a leading layer axis n (stacked
      weights and states); differentiated.
    const: pytree of arrays with the same leading axis, not differentiated
      (e.g. uint32 rounding seeds); its cotangent is zero.
    remat: True (the default): the forward saves only each layer's input
      carry and the backward recomputes the layer's forward from it (per-layer
      rematerialization: ``body`` under ``jax.checkpoint`` with
      ``nothing_saveable``, no ``prevent_cse`` barriers). False: the forward
      saves each layer's VJP residuals that depend on the carry (activations,
      what ``lax.scan`` without remat saves) and the backward runs no forward;
      residuals computed from the layer's ``diff``, ``const`` and closed-over
      values alone (the weights themselves, their casts and transposes) are
      not stacked (that would be a second copy of the weights) but recomputed
      in the backward from slice i, which still holds the old values. To save
      fewer, pass ``jax.checkpoint(body, policy=...)`` (e.g.
      :func:`recompute_elementwise`): the residuals are then the policy's.
      XLA writes slice i in place only where it can order every read of the
      slice before the write: where a layer's cotangent does not depend on a
      value the backward reads from the slice (a plain gradient dW and the
      read of W for dc, with nothing of the forward left to order them), XLA
      on the CPU was seen to copy the stack in every step of the loop (not in
      the fused Llama step, whose new weights depend on the old:
      ``tests/test_llama.py`` checks its compiled step for such copies).

  Returns:
    The final carry. Its VJP returns the cotangent of ``carry`` and, for
    ``diff``, the stacked per-layer cotangents, written layer by layer into
    the buffer that held ``diff`` (in place when ``diff`` is not used again).
    With ``remat`` the forward saves only each layer's input carry (n copies,
    as ``jax.checkpoint`` per layer does); without, n copies of a layer's
    carry-dependent residuals (:func:`saved_residual_avals` lists them).

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
      is (it would silently get no gradient), the leading axes differ, there
      are no layers, or ``remat`` is not a bool.
  """
  if not isinstance(remat, bool):
    raise ValueError(f"inplace_scan: remat must be a bool, got {remat!r}")
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
  if remat:
    converted = jax.checkpoint(
        converted, policy=jax.checkpoint_policies.nothing_saveable,
        prevent_cse=False)
  plan = _ResidualPlan(converted, carry, jax.tree.map(first, diff),
                       jax.tree.map(first, const), tuple(consts))
  return _scan(plan, carry, diff, const, tuple(consts))


def _is_float(a) -> bool:
  return jnp.issubdtype(jnp.result_type(a), jnp.inexact)


def _zero_cotangent(a):
  if _is_float(a):
    return jnp.zeros_like(a)
  return np.zeros(np.shape(a), jax.dtypes.float0)


# ---------------------------------------------------------------------------
# The forward loop saves each layer's residuals (with remat: its input carry
# only, what jax.checkpoint with nothing saveable keeps); the backward loop
# reads them and slice i of the stack, and writes slice i.

# Primitives whose outputs recompute_elementwise does not save: elementwise
# arithmetic, comparisons, casts and shape ops, cheap to recompute in the
# backward from the values it does save.
_ELEMENTWISE = frozenset((
    "abs", "add", "add_any", "and", "broadcast_in_dim", "clamp", "concatenate",
    "convert_element_type", "copy", "copy_p", "cos", "div", "eq", "erf", "exp",
    "expand_dims", "ge", "gt", "integer_pow", "iota", "le", "log", "logistic",
    "lt", "max", "min", "mul", "ne", "neg", "not", "or", "pow", "reduce_max",
    "reduce_sum", "reshape", "rsqrt", "select_n", "sign", "sin", "slice",
    "split", "sqrt", "square", "squeeze", "stack", "stop_gradient", "sub",
    "tanh", "transpose", "xor"))


def recompute_elementwise(prim, *avals, **params) -> bool:
  """A ``jax.checkpoint`` policy: save the outputs of matmuls and of every
  primitive not in a fixed list of elementwise, comparison, cast, reduction
  and shape primitives (custom calls such as fused attention, custom_vjp
  layers included); recompute the listed ones in the backward.

  For ``inplace_scan(jax.checkpoint(body, policy=recompute_elementwise), ...,
  remat=False)``: the forward then saves a block's matmul outputs rather than
  every fp32 intermediate of its norms, RoPE and SiLU (Llama-3.1-8B, T=512,
  XLA attention, traced on the CPU: 78 MiB per block against 238), and the
  backward recomputes no matmul (``tests/test_llama.py`` counts them).

  Args:
    prim: the primitive whose output ``jax.checkpoint`` asks about.
    *avals, **params: its operands' avals and its parameters (unused).

  Returns:
    True to save the primitive's outputs, False to recompute them.
  """
  del avals, params
  return prim.name not in _ELEMENTWISE


def _layer_vjp(body, c, d, k, consts):
  """``jax.vjp`` of one layer in (carry, diff, floating closed-over values)."""
  float_consts = [_is_float(a) for a in consts]
  fl = [a for a, f in zip(consts, float_consts) if f]

  def layer(c, d, fl):
    it = iter(fl)
    return body(c, d, k, *[next(it) if f else a for a, f in zip(consts, float_consts)])

  return jax.vjp(layer, c, d, fl)


class _ResidualPlan:
  """One layer's forward traced once, with ``jax.vjp``, into a jaxpr whose
  outputs are the new carry and the leaves of the VJP (its residuals, the
  primal inputs it keeps included). Each residual is classified by data
  dependence on the carry: dependent ones are saved by the forward scan
  (stacked over the layers); the others (functions of the layer's weights,
  constants and closed-over values: the weights themselves, their casts)
  are recomputed in the backward from slice i, by the jaxpr cut down to
  them (``dce_jaxpr``). The conservative rule: every output of an equation
  with a carry-dependent input is carry-dependent (so a value computed from
  the weights alone inside such an equation is saved; correct, not minimal).

  Not hashable by value; used as a static argument (by identity).
  """

  def __init__(self, body, carry, d0, k0, consts):
    avals = lambda t: jax.tree.map(  # noqa: E731
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), t)
    args = (avals(carry), avals(d0), avals(k0), avals(consts))
    closed, shapes = jax.make_jaxpr(
        lambda c, d, k, cs: _layer_vjp(body, c, d, k, cs), return_shape=True)(*args)
    self.out_tree = jax.tree.structure(shapes)
    jaxpr = closed.jaxpr
    n_c = len(jax.tree.leaves(args[0]))
    self.n_out = len(jax.tree.leaves(shapes[0]))
    dependent = set(jaxpr.invars[:n_c])
    for eqn in jaxpr.eqns:
      if any(not isinstance(v, _Literal) and v in dependent for v in eqn.invars):
        dependent.update(eqn.outvars)
    res = jaxpr.outvars[self.n_out:]
    self.saved = [not isinstance(v, _Literal) and v in dependent for v in res]
    # A value kept by several residuals (a layer input read by several
    # projections) is saved once: `slot` maps each saved residual to it.
    first_of, self.slot = {}, []
    for v, s in zip(res, self.saved):
      self.slot.append(first_of.setdefault(v, len(first_of)) if s else None)
    keep = [True] * self.n_out + [s and res.index(v) == i for i, (v, s)
                                  in enumerate(zip(res, self.saved))]
    self.fwd = _dce(closed, keep, keep_inputs=True)[0]
    self.recompute, used = _dce(closed, [False] * self.n_out +
                                [not s for s in self.saved])
    assert not any(used[:n_c]), "a recomputed residual reads the carry"
    self.recompute_inputs = used[n_c:]
    self.saved_avals = [v.aval for v in first_of]


def _dce(closed, used_outputs, keep_inputs=False):
  jaxpr, used_inputs = _pe.dce_jaxpr(closed.jaxpr, used_outputs,
                                     instantiate=keep_inputs)
  return _core.ClosedJaxpr(jaxpr, closed.consts), used_inputs


def saved_residual_avals(body: Callable[[Any, Any, Any], Any], carry: Any,
                         diff: Any, const: Any) -> list[jax.ShapeDtypeStruct]:
  """Shapes and dtypes of what ``inplace_scan(..., remat=False)`` saves per
  layer (the forward stacks n of each): for checking that no weight-sized
  array is among them. Arguments as :func:`inplace_scan`'s."""
  first = lambda a: a[0]  # noqa: E731
  d0, k0 = jax.tree.map(first, diff), jax.tree.map(first, const)
  converted, consts = jax.closure_convert(body, carry, d0, k0)
  plan = _ResidualPlan(converted, carry, d0, k0, tuple(consts))
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in plan.saved_avals]


def _forward(plan, carry, diff, const, consts, save: bool):
  """The forward loop; with ``save``, also the stacked saved residuals."""
  fwd = _core.jaxpr_as_fun(plan.fwd)

  def step(c, xs):
    out = fwd(*jax.tree.leaves((c, *xs, consts)))
    new = jax.tree.unflatten(jax.tree.structure(c), out[:plan.n_out])
    return new, (out[plan.n_out:] if save else None)
  return lax.scan(step, carry, (diff, const))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan(plan, carry, diff, const, consts):
  return _forward(plan, carry, diff, const, consts, save=False)[0]


def _scan_fwd(plan, carry, diff, const, consts):
  out, saved = _forward(plan, carry, diff, const, consts, save=True)
  return out, (saved, diff, const, consts)


def _scan_bwd(plan, res, g):
  saved, diff, const, consts = res
  n = jax.tree.leaves((diff, const))[0].shape[0]
  float_consts = [_is_float(a) for a in consts]
  recompute = _core.jaxpr_as_fun(plan.recompute)

  def step(j, state):
    i = n - 1 - j
    g, acc, consts_ct = state
    take = lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False)  # noqa: E731
    d_i = jax.tree.map(take, acc)  # slice i is written only below: old values
    k_i = jax.tree.map(take, const)
    inputs = jax.tree.leaves((d_i, k_i, consts))
    again = iter(recompute(*[a for a, u in zip(inputs, plan.recompute_inputs) if u]))
    kept = [take(a) for a in saved]
    leaves = [kept[k] if k is not None else next(again) for k in plan.slot]
    _, vjp = jax.tree.unflatten(plan.out_tree, [None] * plan.n_out + leaves)
    g_c, g_d, g_fl = vjp(g)
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

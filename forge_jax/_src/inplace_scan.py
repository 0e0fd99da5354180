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

_Literal = _core.Literal


def inplace_scan(body: Callable[[Any, Any, Any], Any], carry: Any, diff: Any,
                 const: Any, *, remat: bool = True) -> Any:
  """``carry = body(carry, diff[i], const[i])`` for i = 0 .. n-1; returns it.

  Args:
    body: ``(carry, diff_i, const_i) -> carry`` (same structure, shapes and
      dtypes), a pure function (effects such as ``jax.debug.print`` run in
      the forward loop); traced twice, by ``jax.closure_convert`` and with
      its VJP for both loops.
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
      what ``lax.scan`` without remat saves) and the backward recomputes
      only residuals computed from the layer's ``diff``, ``const`` and
      closed-over values alone (the weights themselves, their casts and
      transposes): those are not stacked (that would be a second copy of the
      weights) but recomputed from slice i, which still holds the old
      values. (Conservatively, a weights-only value computed inside an
      equation that also reads the carry, such as a nested ``jit`` or a
      ``cond`` on the carry, counts as carry-dependent and is saved.) To
      save fewer, pass ``jax.checkpoint(body, policy=..., prevent_cse=False)``
      (e.g. :func:`recompute_elementwise`): the residuals are then the
      policy's.
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
    carry-dependent residuals (``forge_jax._src.inplace_scan.
    saved_residual_avals`` lists them; ``python -m experiments.scan_residuals``
    for the Llama presets).

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
    if _is_float(a):
      raise ValueError(
          f"inplace_scan: const leaves get no gradient, so they may not be "
          f"floating (got {jnp.result_type(a)}); pass it in diff")
  plan, consts = _plan(body, carry, diff, const, remat)
  return _scan(plan, carry, diff, const, consts)


def _plan(body, carry, diff, const, remat: bool):
  """``(_ResidualPlan, consts)`` for ``body`` on layer 0's slices."""
  # Values the body closes over (e.g. a shared scale under jax.grad) become
  # explicit arguments, so their cotangents can be returned (summed over
  # the layers); closed-over values that are not differentiated pass too.
  first = lambda a: a[0]  # noqa: E731
  d0, k0 = jax.tree.map(first, diff), jax.tree.map(first, const)
  converted, consts = jax.closure_convert(body, carry, d0, k0)
  if remat:
    # prevent_cse=False: no optimization_barrier around the recomputation.
    # Its operands (slices of the stacks) would each become a buffer of their
    # own (stop 36: such copies took 14 ms of the scanned 8B step), and the
    # recomputation runs in another loop than the forward, so there is
    # nothing for XLA to merge it with.
    converted = jax.checkpoint(
        converted, policy=jax.checkpoint_policies.nothing_saveable,
        prevent_cse=False)
  consts = tuple(consts)
  return _ResidualPlan(converted, carry, d0, k0, consts), consts


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
    "abs", "add", "add_any", "and", "atan2", "broadcast_in_dim", "cbrt", "ceil",
    "clamp", "concatenate", "convert_element_type", "copy", "cos", "cosh", "div",
    "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt",
    "integer_pow", "iota", "is_finite", "le", "log", "log1p", "logistic", "lt",
    "max", "min", "mul", "ne", "neg", "not", "or", "pad", "pow", "reduce_max",
    "reduce_min", "reduce_precision", "reduce_prod", "reduce_sum", "rem",
    "reshape", "rev", "round", "rsqrt", "select_n", "sign", "sin", "sinh",
    "slice", "split", "sqrt", "square", "squeeze", "stack", "stop_gradient",
    "sub", "tan", "tanh", "transpose", "xor"))


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


def _layer_vjp(body, c, d, k, consts, float_consts):
  """``jax.vjp`` of one layer in (carry, diff, floating closed-over values:
  those where ``float_consts`` is True)."""
  fl = [a for a, f in zip(consts, float_consts) if f]

  def layer(c, d, fl):
    it = iter(fl)
    return body(c, d, k, *[next(it) if f else a for a, f in zip(consts, float_consts)])

  return jax.vjp(layer, c, d, fl)


class _ResidualPlan:
  """One layer's forward traced once, with ``jax.vjp``, into a jaxpr whose
  outputs are the new carry and the leaves of the VJP (its residuals, the
  primal inputs it keeps included). Each residual is classified by data
  dependence on the carry: dependent ones are saved by the forward loop
  (stacked over the layers); the others (functions of the layer's weights,
  constants and closed-over values: the weights themselves, their casts)
  are recomputed in the backward loop from slice i, by the equations they
  need (:func:`_slice`). The rule is conservative: every output of an
  equation with a carry-dependent input is carry-dependent, so a value
  computed from the weights alone inside such an equation (a nested
  ``jit``, a ``cond`` on the carry) is saved: correct, not minimal.

  Not hashable by value; used as a static argument (by identity).
  """

  def __init__(self, body, carry, d0, k0, consts):
    avals = lambda t: jax.tree.map(  # noqa: E731
        lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), t)
    args = (avals(carry), avals(d0), avals(k0), avals(consts))
    self.float_consts = [_is_float(a) for a in consts]
    self.jaxpr, shapes = jax.make_jaxpr(
        lambda c, d, k, cs: _layer_vjp(body, c, d, k, cs, self.float_consts),
        return_shape=True)(*args)
    self.out_tree = jax.tree.structure(shapes)
    jaxpr = self.jaxpr.jaxpr
    n_c = len(jax.tree.leaves(args[0]))
    self.n_out = len(jax.tree.leaves(shapes[0]))
    dependent = set(jaxpr.invars[:n_c])
    for eqn in jaxpr.eqns:
      if any(not isinstance(v, _Literal) and v in dependent for v in eqn.invars):
        dependent.update(eqn.outvars)
    res = jaxpr.outvars[self.n_out:]
    self.saved = [not isinstance(v, _Literal) and v in dependent for v in res]
    self.saved_avals = [v.aval for v, s in zip(res, self.saved) if s]
    self.recompute, used = _slice(self.jaxpr, [False] * self.n_out +
                                  [not s for s in self.saved])
    # By construction no recomputed residual reads the carry.
    self.recompute_inputs = used[n_c:]


def _slice(closed, used_outputs):
  """``(closed jaxpr of the used outputs, used inputs)``: only the equations
  those outputs need, by data dependence. Unlike JAX's ``dce_jaxpr`` it
  drops effects the outputs do not need (a ``jax.debug.print`` of the carry
  is not run again, nor made to read the carry, to recompute a weight)."""
  jaxpr = closed.jaxpr
  outvars = [v for v, u in zip(jaxpr.outvars, used_outputs) if u]
  need = {v for v in outvars if not isinstance(v, _Literal)}
  eqns = []
  for eqn in reversed(jaxpr.eqns):
    if any(v in need for v in eqn.outvars):
      eqns.append(eqn)
      need.update(v for v in eqn.invars if not isinstance(v, _Literal))
  eqns.reverse()
  used_inputs = [v in need for v in jaxpr.invars]
  effects = set().union(*(e.effects for e in eqns))
  new = jaxpr.replace(eqns=eqns, outvars=outvars, effects=effects,
                      invars=[v for v, u in zip(jaxpr.invars, used_inputs) if u])
  return _core.ClosedJaxpr(new, closed.consts), used_inputs


def saved_residual_avals(body: Callable[[Any, Any, Any], Any], carry: Any,
                         diff: Any, const: Any, *, remat: bool = False
                         ) -> list[jax.ShapeDtypeStruct]:
  """Shapes and dtypes of what ``inplace_scan(body, carry, diff, const,
  remat=remat)`` saves per layer (its forward loop stacks n of each), e.g.
  to check that no weight-sized array is among them. Arguments as
  :func:`inplace_scan`'s; nothing is computed (the body is traced)."""
  plan, _ = _plan(body, carry, diff, const, remat)
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in plan.saved_avals]


def _forward(plan, carry, diff, const, consts, save: bool):
  """The forward loop; with ``save``, also the stacked saved residuals.
  (The residuals recomputed in the backward are outputs of the traced layer
  too; unused here, XLA drops them.)"""
  fwd = _core.jaxpr_as_fun(plan.jaxpr)

  def step(c, xs):
    out = fwd(*jax.tree.leaves((c, *xs, consts)))
    new = jax.tree.unflatten(jax.tree.structure(c), out[:plan.n_out])
    res = [r for r, s in zip(out[plan.n_out:], plan.saved) if s]
    return new, (res if save else None)
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
  float_consts = plan.float_consts
  recompute = _core.jaxpr_as_fun(plan.recompute)

  def step(j, state):
    i = n - 1 - j
    g, acc, consts_ct = state
    take = lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False)  # noqa: E731
    d_i = jax.tree.map(take, acc)  # slice i is written only below: old values
    k_i = jax.tree.map(take, const)
    inputs = jax.tree.leaves((d_i, k_i, consts))
    again = iter(recompute(*[a for a, u in zip(inputs, plan.recompute_inputs) if u]))
    kept = iter([take(a) for a in saved])
    leaves = [next(kept) if s else next(again) for s in plan.saved]
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

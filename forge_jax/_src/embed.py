"""ForgeEmbed: flax.linen.Embed whose backward pass also updates its table.

An embedding lookup is a matmul with one-hot inputs: y = onehot(ids) · E, so
its weight gradient is dE = onehot(ids)ᵀ · dY, a (V, D) array that is zero
except in the rows of the tokens seen. Unfused, that gradient is a dense
(V, D) array (Llama-3.1-8B: 128256 × 4096, 1 GB in bf16), the largest
gradient of the model. FORGE's idea (arXiv 2606.22932, the update fused into
the weight-gradient computation) applied to the lookup: the backward pass
applies the optimizer to the table directly and the dense gradient never
exists. :func:`fused_embed_update` sums dY into the rows of the tokens seen
(``segment_sum`` in fp32: at most N rows of dE) and applies the rule to every
row of the table (AdamW still decays the moments and weights of the rows not
seen, as unfused), in one elementwise pass where each row's gradient row is
gathered from the N rows of dE and a zero row. Int8 states of a large table
are re-quantized in slabs of rows after that pass (else XLA keeps each new
moment whole in fp32 between its block maxima and its codes), as
``forge_jax.adamw``'s own unfused update does. Measured on the H200
(``experiments/bench_embed_update``, Llama-3.1-8B's 128256 × 4096 bf16 table,
2048 tokens, table and moments donated; docs/results.md, "Stop 19"):

========  =========================  ===================  ===================
moments   unfused (``fj.adamw``)     fused, one pass      fused (default)
========  =========================  ===================  ===================
bf16      2.67 ms, 1002 MiB temp     1.97 ms, 32.5 MiB    1.97 ms, 32.5 MiB
int8      6.60 ms, 1121 MiB          11.48 ms, 2162 MiB   5.86 ms, 134.5 MiB
========  =========================  ===================  ===================

(bytes floors: 1.47 and 1.01 ms; bf16 states have no slabs.) These savings
are the GPU's: XLA's CPU backend keeps the gathered gradient of the one pass
in fp32, as large as the dense gradient.

The result is the unfused update of the one-hot weight gradient
(:func:`pallas_kernels.fused_dw.fused_dw_update_reference` with
``x = onehot(ids)``), up to the order of the fp32 sums of repeated tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from forge_jax._src import dense as dense_lib
from forge_jax._src import rules as rules_lib
from forge_jax._src import transforms as transforms_lib
from pallas_kernels import quantization
from pallas_kernels.fused_dw import reference

FORGE_STATE = dense_lib.FORGE_STATE
EMBEDDING_INPUT = "embedding"
"""The key, in ``forge_state``, of the table a fused step hands the layer
(as :data:`forge_jax._src.dense.KERNEL_INPUT` for ForgeDense: the same name
as the param)."""

default_embed_init = nn.initializers.variance_scaling(
    1.0, "fan_in", "normal", out_axis=0)


def _row_slab(tree, r0, rows: int):
  """Rows [r0, r0 + rows) of every leaf (all (V, ...)), ``r0`` traced."""
  return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, r0, rows, 0), tree)


def _set_row_slab(tree, new, r0):
  return jax.tree.map(
      lambda a, b: lax.dynamic_update_slice_in_dim(a, b, r0, 0), tree, new)


def _normalized_ids(ids, v: int) -> jax.Array:
  """int32 row indices: negative ids counted from the end, as ``jnp.take``
  does, and V for every id outside [-V, V) (its lookup gave the fill value;
  dropped). Computed in a type that holds both the ids and ±V, so that no
  out-of-range id wraps around into a valid row."""
  wide = jnp.promote_types(ids.dtype, jnp.int32)
  if jnp.issubdtype(ids.dtype, jnp.unsignedinteger):
    wide = ids.dtype if jnp.iinfo(ids.dtype).bits >= 32 else jnp.dtype(jnp.int32)
  x = ids.astype(wide)
  if jnp.issubdtype(wide, jnp.signedinteger):
    x = jnp.where(x < 0, x + v, x)
    ok = (x >= 0) & (x < v)
  else:
    ok = x < v
  return jnp.where(ok, x, v).astype(jnp.int32)


def _zero_after(x) -> jax.Array:
  """int32 0, computed from an element of ``x`` (so that XLA orders what reads
  it after ``x``) in a way XLA does not fold to a constant. Bit-cast to an
  unsigned int, so no value (NaN, inf, -0) makes it nonzero. An empty ``x``
  has no element to wait on: a constant 0."""
  if x.size == 0:
    return jnp.int32(0)
  bits = lax.bitcast_convert_type(x.reshape(-1)[0], jnp.dtype(f"uint{x.dtype.itemsize * 8}"))
  return jnp.minimum(bits, 0).astype(jnp.int32)


def default_slab_rows(shape, state) -> int | None:
  """Rows per slab of the int8 states' update of a table of ``shape``
  (``forge_jax.adamw``'s rule for its own unfused update of a large leaf:
  ``transforms.CHUNK_ELEMENTS`` elements per slab, for tables of at least
  twice that with an int8 state), or None (one pass)."""
  chunk = transforms_lib.CHUNK_ELEMENTS
  v, d = shape
  if (chunk is None or not quantization.any_quantized(state)
      or v * d < 2 * chunk):
    return None
  rows = max(1, chunk // max(d, 1))
  return rows if rows < v else None


def fused_embed_update(ids, dy, table, state, hparams, *, rule, seed=None,
                       slab_rows: int | str | None = "auto"):
  """The optimizer step of an embedding table from its lookup's cotangent.

  Computes ``rule``'s update of ``table`` for the gradient
  dE = onehot(ids)ᵀ · dY without forming dE (see the module docstring): dY
  is summed into the rows seen, and every row's gradient row is gathered
  from those inside the update. The new table is one elementwise pass.
  The new states are too, unless ``slab_rows`` is set: then they are
  computed ``slab_rows`` rows at a time in a loop, in place, after the
  table's pass has read them (the states of every rule of
  :mod:`forge_jax.rules` do not depend on the weights, so the slabs need
  not read the table).

  Args:
    ids: integer (N,), the looked-up rows. Negative ids count from the end,
      as in ``jnp.take``; ids outside [-V, V) contribute nothing (their
      lookup gave the fill value).
    dy: (N, D) float32 or bfloat16, the cotangent of the looked-up rows.
    table: (V, D) float32 or bfloat16, the embedding.
    state: the rule's state arrays, each (V, D): float32, bfloat16 or int8
      ``QuantizedArray`` (blocks of 64 along D).
    hparams: the packed fp32 hyperparameters and step count
      (``ForgeTransformation.packed_hyperparams``).
    rule: an elementwise rule (``forge_jax.rules``); folded rules are refused.
    seed: uint32 scalar: write a bfloat16 table back with stochastic
      rounding from the bits of (seed, count, row · D + column), as
      ForgeDense; None rounds to nearest.
    slab_rows: rows per slab of the states' update; ``'auto'``:
      :func:`default_slab_rows` (slabs for large tables with int8 states,
      whose quantization XLA would otherwise run on a whole fp32 copy of
      each new moment); None: one pass.

  Returns:
    ``(new_table, new_state)`` shaped and stored like the inputs.

  Raises:
    ValueError: if the shapes or dtypes disagree, ``slab_rows`` is not a
      positive int, None or 'auto', or ``rule`` is not elementwise.
  """
  state = tuple(state)
  if not isinstance(rule, rules_lib.ElementwiseRule):
    raise ValueError(f"rule={getattr(rule, 'name', rule)!r}: the fused "
                     "embedding update needs an elementwise rule (not folded "
                     "moments)")
  if table.ndim != 2 or ids.ndim != 1 or dy.shape != (ids.shape[0], table.shape[1]):
    raise ValueError(f"ids {ids.shape}, dy {dy.shape} and table {table.shape} "
                     "must be (N,), (N, D) and (V, D)")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"ids must be integers, got {ids.dtype}")
  if any(tuple(s.shape) != tuple(table.shape) for s in state):
    raise ValueError(f"every state must have the table's shape {table.shape}, "
                     f"got {[tuple(s.shape) for s in state]}")
  v, d = table.shape
  if isinstance(slab_rows, str) and slab_rows == "auto":
    slab_rows = default_slab_rows(table.shape, state)
  elif slab_rows is not None and (not isinstance(slab_rows, int)
                                  or isinstance(slab_rows, bool) or slab_rows < 1):
    raise ValueError(f"slab_rows={slab_rows!r} must be a positive int, None "
                     "or 'auto'")
  n = ids.shape[0]
  hp, count = rule.unpack(hparams)
  if seed is not None:
    seed = reference.as_uint32(seed)
  cols = lax.iota(jnp.uint32, d)

  # The rows seen: sorted unique ids (padding: V), and their rows of dE.
  ids = _normalized_ids(ids, v)
  rows, inverse = jnp.unique(ids, size=n, fill_value=v, return_inverse=True)
  grad_rows = jax.ops.segment_sum(dy.astype(jnp.float32), inverse.reshape(-1),
                                  num_segments=n)
  # Row r's gradient is row pos[r] of `padded`: the rows of dE, then a zero
  # row (index N) for the rows not seen.
  padded = jnp.concatenate([grad_rows, jnp.zeros((1, d), jnp.float32)])
  pos = jnp.full((v,), n, jnp.int32).at[rows].set(
      lax.iota(jnp.int32, n), mode="drop")

  def update(r0, w, st, pos_rows):
    """The rule on rows [r0, r0 + len(pos_rows)), stored in, stored out."""
    new_w, new_st = rule.update_masked(
        padded[pos_rows], w.astype(jnp.float32),
        tuple(quantization.state_to_f32(x) for x in st), hp, count)
    index = reference.element_index(lax.iota(jnp.uint32, w.shape[0]), cols,
                                    reference.as_uint32(r0), 0, d)
    return (reference.round_weight(new_w, table.dtype, seed, count, index),
            tuple(quantization.state_from_f32(x, s)
                  for x, s in zip(new_st, state)))

  new_table, new_state = update(0, table, state, pos)
  if slab_rows is None or slab_rows >= v:
    return new_table, new_state

  # The slabs write the states in place, which the table's pass above read.
  # Unless the loop depends on that pass's result, XLA's copy insertion (which
  # orders instructions by their data dependencies) copies every state first
  # (seen on the H200 in the 8B step: 2 x 501 MiB of int8 codes; and on the
  # CPU). `after` is a zero computed from the new table, added to each slab's
  # offset; an optimization_barrier does not survive to copy insertion.
  after = _zero_after(new_table)

  def slab(r0, size, states):
    r0 = r0 + after
    # The old slab is read whole before it is written (else XLA may hoist
    # fp32 conversions of whole arrays out of the loop).
    st = lax.optimization_barrier(_row_slab(states, r0, size))
    zeros = jnp.zeros((size, d), jnp.float32)  # the states do not read w
    return _set_row_slab(
        states, update(r0, zeros, st, lax.dynamic_slice_in_dim(pos, r0, size))[1],
        r0)

  full, tail = divmod(v, slab_rows)
  states = lax.fori_loop(0, full, lambda i, st: slab(i * slab_rows, slab_rows, st),
                         state)
  if tail:
    states = slab(full * slab_rows, tail, states)
  return new_table, states


def fused_embed_update_reference(ids, dy, table, state, hparams, *, rule,
                                 seed=None):
  """:func:`fused_embed_update` computed unfused: the dense one-hot weight
  gradient dE = onehot(ids)ᵀ · dY, then the rule
  (:func:`pallas_kernels.fused_dw.fused_dw_update_reference`)."""
  v = table.shape[0]
  onehot = jax.nn.one_hot(_normalized_ids(ids, v), v, dtype=jnp.float32)  # V: zeros
  return reference.fused_dw_update_reference(
      onehot, dy.astype(jnp.float32), table, state, hparams, rule=rule,
      seed=seed)


@dataclasses.dataclass(frozen=True, eq=False)
class _Spec:
  """Static description of one fused lookup (hashed by identity)."""

  rule: Any
  dtype: Any
  context: dense_lib.FusedContext
  path: tuple[str, ...]
  broadcast: bool = False  # one row: every id reads it, as in flax Embed


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _forge_lookup(spec, ids, table, state, hparams, probe, seed):
  del state, hparams, probe, seed
  if spec.broadcast:
    return jnp.broadcast_to(table.astype(spec.dtype), ids.shape + table.shape[1:])
  return jnp.take(table.astype(spec.dtype), ids, axis=0)


def _forge_lookup_fwd(spec, ids, table, state, hparams, probe, seed):
  return (_forge_lookup(spec, ids, table, state, hparams, probe, seed),
          (ids, table, state, hparams, probe, seed))


def _forge_lookup_bwd(spec, residuals, dy):
  ids, table, state, hparams, probe, seed = residuals
  state = quantization.from_float_view(state)
  spec.context.record_backward(spec.path)
  rows = jnp.zeros(ids.shape, jnp.int32) if spec.broadcast else ids
  new_table, new_state = fused_embed_update(
      rows.reshape(-1), dy.reshape(-1, dy.shape[-1]), table, state, hparams,
      rule=spec.rule, seed=seed)
  ids_ct = np.zeros(np.shape(ids), jax.dtypes.float0)
  return (ids_ct, new_table, quantization.as_float_view(new_state),
          jnp.zeros_like(hparams),
          *dense_lib.probe_and_seed_cotangents(probe, seed, dy))


_forge_lookup.defvjp(_forge_lookup_fwd, _forge_lookup_bwd)


class ForgeEmbed(nn.Embed):
  """A drop-in ``flax.linen.Embed`` with FORGE's fused optimizer update.

  ``inputs`` (..., integer ids) -> (..., features) rows of the ``embedding``
  param (num_embeddings, features). The fields up to ``embedding_init`` are
  ``flax.linen.Embed``'s, with its defaults and param name.

  The table's optimizer state (AdamW's ``mu`` and ``nu``..., each
  (num_embeddings, features): float32, bfloat16 or int8 ``QuantizedArray``)
  lives in the ``'forge_state'`` collection with a ``probe``, as for
  :class:`forge_jax.ForgeDense`; ``model.init`` creates it. In a fused step
  (:func:`forge_jax.make_train_step`) the lookup's backward pass applies the
  optimizer to the table (:func:`fused_embed_update`): the dense (V, D)
  gradient never exists. Outside a fused step the layer is exactly
  ``flax.linen.Embed``.

  Attributes:
    optimizer: a :class:`forge_jax.ForgeTransformation` with an elementwise
      rule (``forge_jax.adamw``, ``lion``, ...; not ``fold_adam``), or None
      for a plain Embed trained by the step's optax ``tx``.
    stochastic_rounding: write a bfloat16 table back with stochastic
      rounding (its ``rounding_seed`` is a word of the table's init key), else
      round to nearest.

  Raises (at trace time, before anything is computed):
    TypeError: if ``optimizer`` is not a ForgeTransformation.
    ValueError: if the rule is folded; in a fused step, if ``attend`` is
      called (tied weights: the logits' gradient would have to reach the
      table too), the layer has no state, ``param_dtype`` is not float32 or
      bfloat16, or it runs under a mapped axis or a mesh axis of size > 1
      (each would need the gradient all-reduced first).
  """

  optimizer: transforms_lib.ForgeTransformation | None = None
  stochastic_rounding: bool = True

  def setup(self):
    if self.optimizer is not None and not isinstance(
        self.optimizer, transforms_lib.ForgeTransformation):
      raise TypeError(
          "ForgeEmbed.optimizer must be a forge_jax fused transformation such "
          f"as forge_jax.adamw(...), got {type(self.optimizer).__name__}")
    if self.optimizer is not None and not isinstance(
        self.optimizer.rule, rules_lib.ElementwiseRule):
      raise ValueError(
          f"ForgeEmbed.optimizer: the rule {self.optimizer.rule.name!r} is not "
          "elementwise (folded moments); use an elementwise one such as "
          "forge_jax.adamw")
    shape = (self.num_embeddings, self.features)
    self.embedding, keys = dense_lib.fused_param(
        self, "embedding", self.embedding_init, shape)
    dense_lib.create_fused_state(self, shape, keys)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Looks up ``inputs`` (..., integer) -> (..., features)."""
    ctx = dense_lib.active_context(self)
    if ctx is None:
      return super().__call__(inputs)
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError("Input type must be an integer or unsigned integer.")
    path, where = dense_lib.layer_path(self)
    table, state, probe, seed = dense_lib.fused_variables(
        self, "ForgeEmbed", where, EMBEDDING_INPUT, self.param_dtype, ctx,
        inputs)
    rule = self.optimizer.rule
    parallel = sorted(a for a, size in dense_lib.mesh_axis_sizes().items()
                      if size > 1)
    if parallel:
      raise ValueError(
          f"ForgeEmbed at {where!r}: the mesh has the axes {parallel} of size "
          "> 1. The fused table is not sharded, so every device would hold it "
          "whole and update it from its part of the batch, where the update "
          "needs the table's gradient all-reduced first. Use an unfused "
          "embedding (ForgeEmbed(optimizer=None) or flax Embed) under such a "
          "mesh")
    # The lookup's dtype, as Embed's promote_dtype gives it (the params copy
    # of the table is not read: the fused step refuses any use of it).
    dtype = jnp.dtype(self.dtype if self.dtype is not None else table.dtype)
    spec = _Spec(rule=rule, dtype=dtype, context=ctx, path=path,
                 broadcast=self.num_embeddings == 1)
    return _forge_lookup(spec, inputs, table, state,
                         self.optimizer.packed_hyperparams(ctx.step), probe, seed)

  def attend(self, query: jax.Array) -> jax.Array:
    """``flax.linen.Embed.attend``; refused in a fused step (tied weights)."""
    if dense_lib.active_context(self) is not None:
      where = dense_lib.layer_path(self)[1]
      raise ValueError(
          f"ForgeEmbed at {where!r}: attend() in a fused step ties the "
          "table to the logits, whose gradient the fused lookup cannot see. "
          "Use ForgeEmbed(optimizer=None) (or flax Embed) for tied embeddings")
    return super().attend(query)

"""FOAM: Adam with folded moments (Wen et al., 2026, arXiv 2512.07112).

Fold level ``l``: the last axis of a parameter (length n) is split into
blocks of ``B = 2**l`` consecutive elements. The fold operator A replaces each
block by its mean (n -> ceil(n / B)); the unfold operator E repeats each entry
over its block. FOAM keeps Adam's moments folded,

    M̃ <- b1 M̃ + (1 - b1) A(G),      Ṽ <- b2 Ṽ + (1 - b2) A(G²),

recomputes the residual R = G - E(A(G)) every step (never stored), and steps
with the reconstructed moments

    M = E(M̃) + R,   V = E(Ṽ) + R²,
    update = scale * (M / (1 - b1^t)) / (sqrt(V / (1 - b2^t)) + eps),

followed, in :func:`fold_adam`, by decoupled weight decay and the learning
rate. For the folded leaves the state is 1 / 2**l of Adam's (two moments of
n / 2**l elements per row instead of two of n: 2 / 2**l of the parameter
count).

Readings of Ṽ (``nu_mode``): ``'mean_of_squares'`` (default) folds the squared
gradient, A(G²), as the authors' code does; ``'square_of_mean'`` folds the
gradient first, A(G)², as some read the paper. For a gradient constant inside
every block the two agree and R = 0, so both equal Adam.

Which leaves are folded: every leaf with at least 2 dimensions and a
non-empty last axis. A last axis that is not a multiple of ``2**l`` ends in a
partial block whose mean is taken over its real elements only (as if padded,
without the padding diluting the mean). 0-d and 1-d leaves (biases, norm
scales) and zero-size leaves get plain Adam (their moments are full size).

The folded axis is the last one. For a flax kernel (in, out) that is the
output axis; the authors' PyTorch code folds ``nn.Linear.weight`` (out, in)
along its last axis, the input axis. Both are FOAM's algorithm on a
different grouping of elements; this library folds the last axis so that a
fused kernel tile (rows of ``in``, columns of ``out``) holds whole blocks.

The per-block arithmetic is :func:`fold_adam_blocks`, written on
(..., blocks, B) arrays so that the same definition can run on a whole array
or on one tile of a fused kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from forge_jax._src import rules as rules_lib
from forge_jax._src import transforms
from pallas_kernels import quantization

NU_MODES = ("mean_of_squares", "square_of_mean")
ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


class FoldAdamState(NamedTuple):
  """State of :func:`scale_by_fold_adam`.

  Attributes:
    count: int32 (), number of updates so far.
    mu: folded first moment M̃ per leaf: for a folded leaf of shape
      (..., n), shape (..., ceil(n / 2**fold_level)); for an unfolded leaf
      (0-d, 1-d, empty) the leaf's shape. Stored as ``mu_dtype``: float32,
      bfloat16, or int8 (a ``QuantizedArray``: absmax blocks of 64 along the
      folded last axis).
    nu: folded second moment Ṽ, shaped and stored like ``mu`` (``nu_dtype``;
      int8 through its square root).
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def is_folded(shape: tuple[int, ...]) -> bool:
  """Whether a leaf of ``shape`` is folded (>= 2-D with a non-empty last axis)."""
  return len(shape) >= 2 and math.prod(shape) > 0


def folded_shape(shape: tuple[int, ...], fold_level: int) -> tuple[int, ...]:
  """Shape of the folded moments of a leaf of ``shape``."""
  shape = tuple(shape)
  if not is_folded(shape):
    return shape
  block = 2**fold_level
  return shape[:-1] + (-(-shape[-1] // block),)


def _blocks(x: jax.Array, block: int) -> jax.Array:
  """(..., n) -> (..., ceil(n / block), block), zero-padded."""
  n = x.shape[-1]
  pad = -(-n // block) * block - n
  if pad:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
  return x.reshape(x.shape[:-1] + (-1, block))


def _inv_counts(n: int, block: int) -> jax.Array:
  """1 / (real elements) per block of a row of n: (nb,) float32."""
  nb = -(-n // block)
  counts = [block] * (nb - 1) + [n - block * (nb - 1)]
  return 1.0 / jnp.asarray(counts, jnp.float32)


def fold(x: jax.Array, fold_level: int) -> jax.Array:
  """A: block means over the last axis (partial last block: its own mean)."""
  block = 2**fold_level
  n = x.shape[-1]
  return jnp.sum(_blocks(x, block), axis=-1) * _inv_counts(n, block)


def unfold(y: jax.Array, fold_level: int, n: int) -> jax.Array:
  """E: each folded entry repeated over its block, cut to length ``n``."""
  block = 2**fold_level
  return jnp.repeat(y, block, axis=-1)[..., :n]


def _fold_direction(g, mu, nu, hp, block, nu_mode, residual, col_valid=None):
  """:func:`fold_adam_blocks` on a (..., n) gradient; returns the (..., n)
  direction and the new folded moments.

  ``col_valid`` (n,) marks real columns (a kernel tile at the edge of W);
  None means all n are real, a last partial block then averaging its own
  elements. Both the optax transform and the fused rule step through here.
  """
  n = g.shape[-1]
  gb = _blocks(g, block)
  if col_valid is None:
    inv_count, mask = _inv_counts(n, block), None
    if n % block:
      mask = (jnp.arange(gb.shape[-2] * block) < n).reshape(gb.shape[-2:])
  else:
    mask = _blocks(col_valid, block)
    inv_count = 1.0 / jnp.maximum(jnp.sum(mask.astype(jnp.float32), -1), 1.0)
  d, mu, nu = fold_adam_blocks(gb, inv_count, mask, mu, nu, hp,
                               nu_mode=nu_mode, residual=residual)
  return d.reshape(g.shape[:-1] + (-1,))[..., :n], mu, nu


def bias_corrections(b1, b2, count):
  """(1 - b1^t, 1 - b2^t) in fp32, evaluated as ``optax.scale_by_adam`` does."""
  return _bias_correction(b1, count), _bias_correction(b2, count)


@functools.partial(jax.jit, inline=True)
def _bias_correction(decay, count):
  return (1 - decay**count).astype(jnp.float32)


def fold_adam_blocks(gb, inv_count, mask, mu, nu, hp, *,
                     nu_mode: str = "mean_of_squares", residual: bool = True):
  """FOAM's step on blocks: returns ``(direction_blocks, new_mu, new_nu)``.

  Args:
    gb: fp32 gradient blocks (..., nb, B); padding lanes must be 0.
    inv_count: (nb,) or broadcastable: 1 / number of real elements per block.
    mask: bool (..., nb, B) of real lanes, or None when every lane is real.
    mu, nu: fp32 folded moments (..., nb).
    hp: mapping with scalars ``b1``, ``b2``, ``one_minus_b1``,
      ``one_minus_b2`` (computed before any fp32 cast, as optax does), ``eps``,
      ``eps_root``, ``scale`` and the bias corrections ``bc1`` = 1 - b1^t, ``bc2`` = 1 - b2^t
      (:func:`bias_corrections`).
    nu_mode: ``'mean_of_squares'`` (A(G²)) or ``'square_of_mean'`` (A(G)²).
    residual: add the residual R (False: the ablation without it).

  The arithmetic mirrors ``optax.scale_by_adam`` (so that fold level 0, or a
  blockwise-constant gradient, gives Adam's numbers: bit for bit under
  ``jax.jit`` in fp32, as in a training step; op-by-op eager execution may
  differ in the last bit).
  """
  b1, b2 = hp["b1"], hp["b2"]
  a = jnp.sum(gb, axis=-1) * inv_count
  if nu_mode == "mean_of_squares":
    a2 = jnp.sum(gb * gb, axis=-1) * inv_count
  else:
    a2 = a * a
  mu = hp["one_minus_b1"] * a + b1 * mu
  nu = hp["one_minus_b2"] * a2 + b2 * nu
  m = jnp.broadcast_to(mu[..., None], gb.shape)
  v = jnp.broadcast_to(nu[..., None], gb.shape)
  if residual:
    r = gb - a[..., None]
    if mask is not None:
      r = jnp.where(mask, r, 0.0)
    m = m + r
    v = v + r * r
  m_hat = m / hp["bc1"]
  v_hat = v / hp["bc2"]
  direction = m_hat / (jnp.sqrt(v_hat + hp["eps_root"]) + hp["eps"])
  return hp["scale"] * direction, mu, nu


@dataclasses.dataclass(frozen=True)
class FoldAdamRule:
  """fold_adam as a fused-kernel rule: the interface of ``ElementwiseRule``
  that :func:`pallas_kernels.fused_dw.fused_dw_update` uses, with folded
  state (FOAM inside FORGE's epilogue).

  For a kernel W of shape (in, out) the state arrays ``mu`` and ``nu`` have
  shape (in, ceil(out / 2**fold_level)); a kernel tile of ``bn`` columns
  owns ``bn / 2**fold_level`` state columns, so tiles must be a multiple of
  2**fold_level wide (:attr:`min_block_n`). The step is
  :func:`fold_adam_blocks` on the tile's gradient, then decoupled weight
  decay and the learning rate, as :func:`fold_adam` computes them.
  """

  fold_level: int
  nu_mode: str = "mean_of_squares"
  residual: bool = True

  state_names = ("mu", "nu")
  nonnegative_states = ("nu",)
  hyperparam_names = ("learning_rate", "b1", "b2", "eps", "eps_root", "scale",
                      "weight_decay")
  packed_names = hyperparam_names + ("one_minus_b1", "one_minus_b2", "bc1", "bc2")

  def __post_init__(self):
    object.__setattr__(self, "fold_level", _fold_level(self.fold_level))
    if self.nu_mode not in NU_MODES:
      raise ValueError(f"nu_mode={self.nu_mode!r} must be one of {NU_MODES}")

  @property
  def name(self) -> str:
    return f"fold_adam_l{self.fold_level}"

  @property
  def block(self) -> int:
    return 2**self.fold_level

  @property
  def min_block_n(self) -> int:
    return max(16, self.block)

  @property
  def num_hyperparams(self) -> int:
    return len(self.packed_names) + 1

  def state_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    return folded_shape(tuple(shape), self.fold_level)

  def state_cols(self, cols: int) -> int:
    return cols // self.block

  def hyperparams_f32(self, raw):
    """fp32 scalars for ``hyperparam_names`` (validated when concrete).

    Raises:
      ValueError: for a missing, non-scalar or out-of-range hyperparameter.
    """
    missing = [n for n in self.hyperparam_names if n not in raw]
    if missing:
      raise ValueError(f"hyperparams is missing {missing} for rule {self.name!r}")
    # A string, None, ... named first, then the ranges.
    out = {n: rules_lib._real_scalar(n, raw[n])  # pylint: disable=protected-access
           for n in self.hyperparam_names}
    rules_lib.check_learning_rate(raw)
    _check("b1", raw["b1"], 0.0, 1.0)
    _check("b2", raw["b2"], 0.0, 1.0)
    _check("eps", raw["eps"], 0.0, float("inf"))
    _check("eps_root", raw["eps_root"], 0.0, float("inf"))
    _check("weight_decay", raw["weight_decay"], 0.0, float("inf"))
    return out

  def pack(self, hyperparams, count) -> jax.Array:
    """``[*hyperparam_names, 1 - b1, 1 - b2, 1 - b1^t, 1 - b2^t, count]`` in fp32.

    ``1 - b`` is formed from the raw value (double precision for a Python
    float) and the bias corrections by :func:`bias_corrections` from the
    integer ``count``, exactly as the optax transform computes them.

    Raises:
      ValueError: as :meth:`hyperparams_f32`, or for a concrete ``count``
        below 1 or NaN (the bias corrections divide by 1 - b**count).
    """
    rules_lib.check_count(count)
    hp = self.hyperparams_f32(hyperparams)
    b1, b2 = hyperparams["b1"], hyperparams["b2"]
    count_i = jnp.asarray(count).astype(jnp.int32)
    bc1, bc2 = bias_corrections(b1, b2, count_i)
    extra = [jnp.asarray(1 - b1, jnp.float32), jnp.asarray(1 - b2, jnp.float32),
             bc1, bc2]
    return jnp.stack([hp[n] for n in self.hyperparam_names] + extra
                     + [count_i.astype(jnp.float32)])

  def unpack(self, hparams):
    values = [hparams[i] for i in range(self.num_hyperparams)]
    return dict(zip(self.packed_names, values[:-1])), values[-1]

  def update_masked(self, grad, param, state, hp, count, col_valid=None):
    """One fused step on a (rows, cols) gradient tile or whole kernel.

    Args:
      grad, param: fp32 (rows, cols); ``grad`` is 0 where ``col_valid`` is
        False.
      state: fp32 (mu, nu), each (rows, ceil(cols / 2**l)).
      hp: from :meth:`unpack`.
      count: unused (the bias corrections are packed).
      col_valid: bool (cols,) of real columns, or None (all real).

    Returns:
      ``(new_param, (mu, nu))`` in fp32.
    """
    del count
    mu, nu = state
    direction, mu, nu = _fold_direction(grad, mu, nu, hp, self.block,
                                        self.nu_mode, self.residual, col_valid)
    return _decay_and_step(direction, param, hp), (mu, nu)

  def update_rows(self, grad, param, state_rows, hp, count=None):
    """The step of :meth:`update_masked` with the folded moments as rows of
    their transpose: the Mosaic GPU kernel's form.

    Args:
      grad, param: fp32 (rows, cols), ``cols`` a multiple of 2**l (whole
        blocks; no edge mask).
      state_rows: ``(mu_rows, nu_rows)``, each a tuple of cols / 2**l fp32
        vectors of shape (rows,): entry j holds fold block j's moment for
        every row (column j of the (rows, cols / 2**l) folded state).
      hp: from :meth:`unpack`.
      count: unused (the bias corrections are packed).

    Returns:
      ``(new_param, (mu_rows, nu_rows))`` in fp32, the rows as given.

    Block j is :func:`fold_adam_blocks` on the (rows, 2**l) slice of the
    gradient, the same definition as the optax transform's: only the order
    of the 2**l-element sums may differ.

    Raises:
      ValueError: if ``cols`` is not a multiple of 2**l, or the number of
        rows in ``state_rows`` is not cols / 2**l.
    """
    del count
    block, cols = self.block, grad.shape[-1]
    mu_rows, nu_rows = state_rows
    if cols % block or not len(mu_rows) == len(nu_rows) == cols // block:
      raise ValueError(
          f"update_rows needs a tile of whole fold blocks ({block} columns) "
          f"and one state row per block: got {cols} columns and "
          f"{len(mu_rows)}, {len(nu_rows)} rows")
    directions, new_mu, new_nu = [], [], []
    for j, (mu, nu) in enumerate(zip(mu_rows, nu_rows)):
      d, mu, nu = fold_adam_blocks(
          grad[..., j * block:(j + 1) * block], 1.0 / block, None, mu, nu, hp,
          nu_mode=self.nu_mode, residual=self.residual)
      directions.append(d)
      new_mu.append(mu)
      new_nu.append(nu)
    direction = (directions[0] if len(directions) == 1
                 else jnp.concatenate(directions, axis=-1))
    return (_decay_and_step(direction, param, hp),
            (tuple(new_mu), tuple(new_nu)))


def _decay_and_step(direction, param, hp):
  """Decoupled weight decay and the learning rate, as :func:`fold_adam`."""
  update = direction + hp["weight_decay"] * param
  return param + update * (-hp["learning_rate"])


def _fold_level(fold_level) -> int:
  """A Python int in [0, 16] (NumPy integers accepted; not a traced value:
  with ``optax.inject_hyperparams`` pass ``static_args=('fold_level',)``)."""
  level = None
  if not isinstance(fold_level, (bool, jax.core.Tracer)):
    try:
      level = operator.index(fold_level)
    except TypeError:
      level = None
  if level is None or not 0 <= level <= 16:
    got = ("<a traced value>" if isinstance(fold_level, jax.core.Tracer)
           else repr(fold_level))
    raise ValueError(
        f"fold_level={got} must be an int in [0, 16] (a static value: "
        "with optax.inject_hyperparams pass static_args=('fold_level',))")
  return int(level)


def _check(name: str, value, low: float, high: float) -> None:
  if isinstance(value, jax.core.Tracer) or callable(value):
    return
  if isinstance(value, (str, bytes, bool)):
    raise ValueError(f"{name}={value!r} must be a real number")
  try:
    v = float(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{name}={value!r} must be a real number") from e
  if not low <= v < high:
    raise ValueError(f"{name}={v} must be in [{low}, {high})")


def scale_by_fold_adam(
    fold_level: int = 2,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    scale: float = 1.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nu_mode: str = "mean_of_squares",
    residual: bool = True,
) -> optax.GradientTransformation:
  r"""FOAM's direction: Adam with moments folded over blocks of ``2**fold_level``.

  See the module docstring for the algorithm and which leaves are folded.

  Args:
    fold_level: l >= 0; blocks of 2**l elements of the last axis (0 is Adam).
    b1, b2, eps, eps_root: as ``optax.scale_by_adam``.
    scale: α, multiplies the direction (the paper's per-group scale).
    mu_dtype, nu_dtype: storage of the folded moments: None/float32,
      bfloat16 or int8 (absmax blocks of 64 along the folded axis, ``nu``
      through its square root; see ``pallas_kernels.quantization``).
    nu_mode: ``'mean_of_squares'`` (A(G²), the authors' code) or
      ``'square_of_mean'`` (A(G)²).
    residual: False drops R (the ablation; moments then fully folded).

  Returns:
    An ``optax.GradientTransformation`` with state :class:`FoldAdamState`;
    updates have each gradient's dtype (computed in fp32).

  Raises:
    ValueError: for a negative or non-integer fold_level, b1/b2 outside
      [0, 1), negative or non-finite eps/eps_root/scale, a hyperparameter
      that is not a real number (a string, a bool), an unknown nu_mode or
      state dtype, ``residual`` not True or False; from ``init``, for a
      param leaf that is not real floating point (optax's ``adam`` would
      keep integer leaves at zero update silently).

  References:
    Wen et al., FOAM: Blocked State Folding for Memory-Efficient LLM
    Training, https://arxiv.org/abs/2512.07112
  """
  fold_level = _fold_level(fold_level)
  _check("b1", b1, 0.0, 1.0)
  _check("b2", b2, 0.0, 1.0)
  _check("eps", eps, 0.0, float("inf"))
  _check("eps_root", eps_root, 0.0, float("inf"))
  _check("scale", scale, 0.0, float("inf"))
  if nu_mode not in NU_MODES:
    raise ValueError(f"nu_mode={nu_mode!r} must be one of {NU_MODES}")
  if not isinstance(residual, (bool, np.bool_)):
    raise ValueError(f"residual={residual!r} must be True or False")
  residual = bool(residual)
  mu_dtype = quantization.state_dtype("mu_dtype", mu_dtype)
  nu_dtype = quantization.state_dtype("nu_dtype", nu_dtype)
  block = 2**fold_level

  def init_fn(params):
    transforms.require_floating(
        params, "fold_adam",
        " (leave it out with optax.masked or optax.multi_transform)")

    def moment(p, dtype, nonneg):
      shape = folded_shape(jnp.shape(p), fold_level)
      return quantization.full_state(shape, 0.0, dtype, nonneg)
    return FoldAdamState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(lambda p: moment(p, mu_dtype, False), params),
        nu=jax.tree.map(lambda p: moment(p, nu_dtype, True), params))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    bc1, bc2 = bias_corrections(b1, b2, count)
    hp = {"b1": b1, "b2": b2, "one_minus_b1": 1 - b1, "one_minus_b2": 1 - b2,
          "eps": eps, "eps_root": eps_root, "scale": scale, "bc1": bc1,
          "bc2": bc2}
    treedef = jax.tree.structure(updates)
    mus = treedef.flatten_up_to(state.mu)
    nus = treedef.flatten_up_to(state.nu)
    out_u, out_mu, out_nu = [], [], []
    for g, mu_s, nu_s in zip(jax.tree.leaves(updates), mus, nus):
      mu = quantization.state_to_f32(mu_s)
      nu = quantization.state_to_f32(nu_s)
      g32 = jnp.asarray(g).astype(jnp.float32)
      if is_folded(g32.shape):
        d, mu, nu = _fold_direction(g32, mu, nu, hp, block, nu_mode, residual)
      else:  # plain Adam: blocks of one element
        d, mu, nu = fold_adam_blocks(
            g32[..., None], 1.0, None, mu, nu, hp,
            nu_mode=nu_mode, residual=residual)
        d = d[..., 0]
      out_u.append(d.astype(jnp.result_type(g)))
      out_mu.append(quantization.state_from_f32(mu, mu_s))
      out_nu.append(quantization.state_from_f32(nu, nu_s))
    unflat = lambda xs: jax.tree.unflatten(treedef, xs)  # noqa: E731
    return unflat(out_u), FoldAdamState(count=count, mu=unflat(out_mu),
                                        nu=unflat(out_nu))

  return optax.GradientTransformation(init_fn, update_fn)


def fold_adam(
    learning_rate: ScalarOrSchedule,
    fold_level: int = 2,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    scale: float = 1.0,
    mask: Any = None,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nu_mode: str = "mean_of_squares",
    residual: bool = True,
) -> optax.GradientTransformation:
  """FOAM with decoupled weight decay and a learning rate (AdamW's layout).

  ``optax.chain(scale_by_fold_adam(...), optax.add_decayed_weights(
  weight_decay, mask), optax.scale_by_learning_rate(learning_rate))``, then a
  cast of each update to its param's dtype (so that bf16 params get bf16
  updates even with fp32 hyperparameters from ``optax.inject_hyperparams``):
  with ``fold_level=0`` and ``scale=1`` it is ``optax.adamw``. The step of a
  parameter p is ``-lr * (scale * FOAM direction + weight_decay * p)``.

  Args:
    learning_rate: a float or an optax schedule.
    fold_level, b1, b2, eps, eps_root, scale, mu_dtype, nu_dtype, nu_mode,
      residual: see :func:`scale_by_fold_adam`.
    weight_decay: decoupled weight decay.
    mask: as in ``optax.adamw``: a tree (or a function of params giving one)
      of bools choosing the leaves that get weight decay.

  Returns:
    A :class:`forge_jax.ForgeTransformation` (without ``mask``; a plain
    optax transformation with one): an optax transformation (state: a tuple
    whose first entry is :class:`FoldAdamState`) that
    :class:`forge_jax.ForgeDense` also runs fused, the folded moments
    updated tile by tile in the kernel epilogue.

  Examples:
    >>> import jax.numpy as jnp, optax, forge_jax as fj
    >>> tx = fj.fold_adam(1e-3, fold_level=3)
    >>> params = {'w': jnp.ones((16, 64)), 'b': jnp.ones(64)}
    >>> state = tx.init(params)
    >>> state[0].mu['w'].shape, state[0].mu['b'].shape
    ((16, 8), (64,))
  """
  _check("weight_decay", weight_decay, 0.0, float("inf"))
  lr0 = learning_rate(0) if callable(learning_rate) else learning_rate
  rules_lib._real_scalar("learning_rate", lr0)  # pylint: disable=protected-access
  rules_lib.check_learning_rate({"learning_rate": lr0})
  tx = optax.chain(
      scale_by_fold_adam(fold_level, b1, b2, eps, eps_root, scale,
                         mu_dtype=mu_dtype, nu_dtype=nu_dtype, nu_mode=nu_mode,
                         residual=residual),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
      transforms.cast_to_param_dtype(),
  )
  if mask is not None:
    # A weight-decay mask is a property of a params tree; a fused layer has
    # one kernel, so this transformation is optax-only (ForgeDense refuses it).
    return tx
  rule = FoldAdamRule(fold_level, nu_mode, residual)
  hyperparams = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                     eps_root=eps_root, scale=scale, weight_decay=weight_decay)
  for n, v in hyperparams.items():
    if callable(v) and n != "learning_rate":
      raise ValueError(f"{n} must be a number, not a schedule (only "
                       "learning_rate may be a schedule)")
  return transforms.ForgeTransformation.create(
      tx, rule, hyperparams, state_dtypes=(mu_dtype, nu_dtype))


# ---------------------------------------------------------------------------
# The paper's hybrid recipe.

DEFAULT_UNFOLDED = ("embed", "lm_head", "head", "norm")


def fold_adam_labels(params, unfolded: tuple[str, ...] = DEFAULT_UNFOLDED,
                     ) -> Any:
  """Labels ``'fold'`` / ``'adam'`` for ``optax.partition``, as the paper splits.

  A leaf is ``'fold'`` when it has at least 2 dimensions and no word of a
  key on its path (keys split at ``_``, digits and other non-letters,
  case-insensitive) starts or ends with one of ``unfolded``: the attention
  and MLP matrices of a transformer. Embeddings (``embed``, ``Embed_0``,
  ``embedding``), the LM head (``lm_head``, ``head``), norm scales
  (``attn_norm``, ``LayerNorm_0``, ``RMSNorm``) and biases (1-D) are
  ``'adam'``; ``MultiHeadDotProductAttention_0/query`` is ``'fold'``.
  """
  low = tuple(u.lower() for u in unfolded)

  def label(path, leaf):
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
            for k in path]
    words = [w for k in keys for w in re.split(r"[^a-z]+", k.lower()) if w]
    if jnp.ndim(leaf) < 2 or any(w.startswith(u) or w.endswith(u)
                                 for w in words for u in low):
      return "adam"
    return "fold"

  return jax.tree_util.tree_map_with_path(label, params)


def hybrid_fold_adam(
    learning_rate: ScalarOrSchedule,
    fold_level: int = 2,
    scale: float = 0.25,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    unfolded: tuple[str, ...] = DEFAULT_UNFOLDED,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nu_mode: str = "mean_of_squares",
    residual: bool = True,
    adam_moment_dtype: Any = None,
) -> optax.GradientTransformation:
  """FOAM's recipe: fold_adam (× ``scale``) on matrices, AdamW on the rest.

  ``optax.partition`` over :func:`fold_adam_labels`: the ``'fold'`` group
  gets :func:`fold_adam` with ``scale`` (α, the authors' 0.25 at l = 2), the
  ``'adam'`` group (embeddings, head, norms, biases) ``optax.adamw`` with the
  same learning rate, betas, eps and weight decay. Defaults follow the
  authors' scripts (l = 2, α = 0.25, betas (0.9, 0.95)).

  Args:
    learning_rate: float or schedule, for both groups.
    fold_level, scale: l and α of the folded group.
    b1, b2, eps, weight_decay: both groups.
    unfolded: name fragments kept on AdamW (see :func:`fold_adam_labels`).
    mu_dtype, nu_dtype, nu_mode, residual: the folded group's
      :func:`fold_adam` options.
    adam_moment_dtype: None (default): the AdamW group is ``optax.adamw``
      with fp32 moments; float32, bfloat16 or int8: it is
      :func:`forge_jax.adamw` (numerically ``optax.adamw``) with both moments
      stored so (int8: absmax blocks of 64, see
      :mod:`pallas_kernels.quantization`). With int8 here and in the folded
      group a 60M model's optimizer state is 14% of AdamW's.

  Returns:
    An ``optax.GradientTransformation`` (an ``optax.partition``).
  """
  return optax.partition(
      {"fold": fold_adam(learning_rate, fold_level, b1, b2, eps,
                         weight_decay=weight_decay, scale=scale,
                         mu_dtype=mu_dtype, nu_dtype=nu_dtype, nu_mode=nu_mode,
                         residual=residual),
       "adam": (optax.adamw(learning_rate, b1, b2, eps,
                            weight_decay=weight_decay)
                if adam_moment_dtype is None else
                transforms.adamw(learning_rate, b1, b2, eps,
                                 weight_decay=weight_decay,
                                 mu_dtype=adam_moment_dtype,
                                 nu_dtype=adam_moment_dtype))},
      lambda params: fold_adam_labels(params, unfolded))

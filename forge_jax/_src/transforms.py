"""optax transforms built on the elementwise rules, and their fused form.

Each optimizer comes in optax's three names, e.g. :func:`scale_by_adamw`
(the direction, no learning rate), :class:`ScaleByAdamWState` and
:func:`adamw` (with the learning rate). The alias returns a
:class:`ForgeTransformation`: an ordinary ``optax.GradientTransformationExtraArgs``
that also carries its rule and hyperparameters, so the same object can be
given to :class:`forge_jax.ForgeDense` to run fused in the backward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
import optax

from forge_jax._src import rules as rules_lib
from pallas_kernels import quantization

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class _FusedUpdate:
  """The ``update`` function of a ForgeTransformation, carrying its rule."""

  fn: Callable[..., Any]
  rule: rules_lib.ElementwiseRule
  hyperparams: Mapping[str, ScalarOrSchedule]
  state_init: tuple[Any, ...]
  state_dtypes: tuple[Any, ...]

  def __call__(self, updates, state, params=None, **extra_args):
    return self.fn(updates, state, params, **extra_args)


class ForgeTransformation(optax.GradientTransformationExtraArgs):
  """An optax transformation that ForgeDense can also apply fused.

  It is a ``GradientTransformationExtraArgs`` (``init``, ``update``) usable in
  any optax chain. Its ``update`` carries the elementwise rule and the
  hyperparameters, exposed as :attr:`rule` and :attr:`hyperparams`, so that
  :class:`forge_jax.ForgeDense` runs the same definition fused.
  """

  __slots__ = ()

  @classmethod
  def create(cls, tx: optax.GradientTransformation,
             rule: rules_lib.ElementwiseRule,
             hyperparams: Mapping[str, ScalarOrSchedule],
             state_init: tuple[float, ...] | None = None,
             state_dtypes: tuple[Any, ...] | None = None,
             ) -> "ForgeTransformation":
    """Wraps ``tx`` (which must compute ``rule``) with its fused description.

    ``state_init`` gives each state array's initial value (default zeros),
    ``state_dtypes`` its storage dtype (default float32).
    """
    missing = set(rule.hyperparam_names) - set(hyperparams)
    if missing:
      raise ValueError(f"hyperparams is missing {sorted(missing)}")
    if state_init is None:
      state_init = (0.0,) * len(rule.state_names)
    if len(state_init) != len(rule.state_names):
      raise ValueError(f"state_init needs one value per {rule.state_names}")
    state_dtypes = _state_dtypes(rule, state_dtypes)
    tx = optax.with_extra_args_support(tx)
    return cls(tx.init, _FusedUpdate(tx.update, rule, dict(hyperparams),
                                     tuple(state_init), state_dtypes))

  @property
  def state_init(self) -> tuple[float, ...]:
    """Initial value of each state array, ordered like ``rule.state_names``."""
    return self.update.state_init

  @property
  def state_dtypes(self) -> tuple[jnp.dtype, ...]:
    """Storage dtype of each state array (float32, bfloat16 or int8)."""
    return self.update.state_dtypes

  def init_state(self, shape: tuple[int, ...],
                 scale_transposed: bool = False) -> dict[str, Any]:
    """The initial state arrays of one parameter of ``shape``, by name.

    Each is an array of ``rule.state_shape(shape)`` (the param's shape for an
    elementwise rule; folded for fold_adam), float32 or bfloat16, or for int8
    a :class:`~pallas_kernels.quantization.QuantizedArray`, whose scales are
    stored transposed with ``scale_transposed`` (where the state has at
    least two axes; the fused kernels' layout, as ``ForgeDense`` keeps them).
    """
    state_shape = self.rule.state_shape(tuple(shape))
    transposed = bool(scale_transposed) and len(state_shape) >= 2
    return {n: quantization.full_state(
        state_shape, v, d, n in self.rule.nonnegative_states, transposed)
            for n, v, d in zip(self.rule.state_names, self.state_init,
                               self.state_dtypes)}

  @property
  def rule(self) -> rules_lib.ElementwiseRule:
    """The :class:`~forge_jax.rules.ElementwiseRule` both paths evaluate."""
    return self.update.rule

  @property
  def hyperparams(self) -> Mapping[str, ScalarOrSchedule]:
    """``rule.hyperparam_names`` -> float or schedule of the step count."""
    return self.update.hyperparams

  def hyperparams_at(self, step: jax.Array) -> dict[str, Any]:
    """Hyperparameter values at ``step`` (0 for the first update).

    Schedules are evaluated at ``step`` as optax's ``scale_by_learning_rate``
    evaluates them at its own count.
    """
    return {n: v(step) if callable(v) else v for n, v in self.hyperparams.items()}

  def packed_hyperparams(self, step: jax.Array) -> jax.Array:
    """``rule.pack(hyperparams_at(step), step + 1)``: one fp32 vector."""
    return self.rule.pack(self.hyperparams_at(step), jnp.asarray(step) + 1)


def _state_dtypes(rule: rules_lib.ElementwiseRule, dtypes) -> tuple[Any, ...]:
  """Validated storage dtypes, one per state (None -> float32)."""
  if dtypes is None:
    dtypes = (None,) * len(rule.state_names)
  if len(dtypes) != len(rule.state_names):
    raise ValueError(f"state_dtypes needs one dtype per {rule.state_names}")
  return tuple(quantization.state_dtype(f"{n}_dtype", d)
               for n, d in zip(rule.state_names, dtypes))


def _validate(rule: rules_lib.ElementwiseRule, hyperparams: Mapping[str, Any]):
  """Checks hyperparameters once, at construction (schedules at step 0).

  Only the learning rate may be a schedule.
  """
  for n, v in hyperparams.items():
    if callable(v) and n != rules_lib.LEARNING_RATE:
      raise ValueError(f"{n} must be a number, not a schedule (only "
                       "learning_rate may be a schedule)")
  rule.hyperparams_f32({n: v(0) if callable(v) else v
                        for n, v in hyperparams.items()})


def require_floating(params, who: str, hint: str = "") -> None:
  """Raises ValueError, naming ``who``, if a leaf of ``params`` is not real
  floating point (an optimizer's moments and steps are fp)."""
  for p in jax.tree.leaves(params):
    if not jnp.issubdtype(jnp.result_type(p), jnp.floating):
      raise ValueError(f"{who}: params must be real floating point, got a "
                       f"{jnp.result_type(p)} leaf{hint}")


def _scale_by_rule(rule: rules_lib.ElementwiseRule, hp: Mapping[str, Any],
                   state_cls, state_init: tuple[float, ...] | None = None,
                   out_dtype: Any = None,
                   state_dtypes: tuple[Any, ...] | None = None,
                   ) -> optax.GradientTransformation:
  """The optax transformation of ``rule``: its direction, no learning rate.

  State: ``state_cls(count, *state arrays)``, each shaped like its param and
  stored as ``state_dtypes`` (float32 by default; bfloat16; int8 as a
  ``QuantizedArray``), computed in fp32. ``update`` needs ``params``; updates
  keep each param's dtype (or are ``out_dtype``: the aliases keep fp32 until
  the learning rate is applied, then cast).
  """
  hp = {rules_lib.LEARNING_RATE: 0.0, **hp}
  _validate(rule, hp)
  state_init = state_init or (0.0,) * len(rule.state_names)
  state_dtypes = _state_dtypes(rule, state_dtypes)

  def init_fn(params):
    arrays = {n: jax.tree.map(
        lambda p, v=v, d=d, n=n: quantization.full_state(
            jnp.shape(p), v, d, n in rule.nonnegative_states), params)
              for n, v, d in zip(rule.state_names, state_init, state_dtypes)}
    return state_cls(count=jnp.zeros([], jnp.int32), **arrays)

  wd = hp.get("weight_decay", 0.0)
  no_decay = not callable(wd) and not isinstance(wd, jax.core.Tracer) and float(wd) == 0

  def update_fn(updates, state, params=None):
    if params is None:
      if not no_decay:
        raise ValueError(f"{rule.name}: update needs params (for weight decay):"
                         " call update(updates, state, params)")
      params = jax.tree.map(jnp.zeros_like, updates)  # unused: 0 * param
    count = optax.safe_increment(state.count)
    hpv = rule.hyperparams_f32(hp)
    count_f = count.astype(jnp.float32)

    require_floating(params, rule.name)

    def rule_on(g, p, arrays):
      direction, new = rule.direction(
          g.astype(jnp.float32), p.astype(jnp.float32),
          tuple(quantization.state_to_f32(a) for a in arrays), hpv, count_f)
      return direction, tuple(quantization.state_from_f32(x, a)
                              for x, a in zip(new, arrays))

    def leaf(g, p, *arrays):
      direction, new = rule_on(g, p, arrays)
      rows = _chunk_rows(g, arrays)
      if rows:  # the same states, computed a slab of rows at a time
        new = _states_by_rows(rule_on, g, p, arrays, rows)
      return (direction.astype(out_dtype or p.dtype), *new)

    treedef = jax.tree.structure(updates)
    arrays = [treedef.flatten_up_to(getattr(state, n)) for n in rule.state_names]
    out = [leaf(g, p, *a) for g, p, *a in zip(
        treedef.flatten_up_to(updates), treedef.flatten_up_to(params), *arrays)]
    columns = [jax.tree.unflatten(treedef, list(col)) for col in zip(*out)]
    if not out:  # an empty tree
      columns = [updates] + [updates] * len(rule.state_names)
    direction, new = columns[0], columns[1:]
    return direction, state_cls(count=count, **dict(zip(rule.state_names, new)))

  return optax.GradientTransformation(init_fn, update_fn)


CHUNK_ELEMENTS: int | None = 1 << 24
"""Elements per slab when a quantized state's update is computed in slabs.

None turns slabs off: do so when params are split by rows over devices on a
mesh of ``AxisType.Auto`` axes (FSDP along the leading axis), where each slab
would be gathered onto every device. Leaves sharded over explicit mesh axes
are never split (detected while tracing).
"""


def _chunk_rows(g, arrays) -> int | None:
  """Rows per slab for a leaf whose int8 states are updated in slabs, or None.

  Quantizing a new moment takes its block maxima before its codes; XLA
  keeps the whole fp32 moment between the two passes (2 GiB for a
  Llama-3.1-8B embedding's, measured in the H200's buffer assignment, more
  than the int8 state itself). A leaf of at least 2·CHUNK_ELEMENTS
  elements, 2-D or more, with an int8 state and not known to be sharded
  (see :func:`_sharded`) is therefore updated in slabs of leading-axis rows (blocks lie
  along the last axis, so a slab holds whole blocks). The formulas are the
  same; XLA may still round a slab's fused arithmetic differently from the
  whole leaf's (1-ulp scale differences seen on the CPU in some chains;
  bit-identical in the tests), and only the fp32 temporary is one slab.
  """
  if (CHUNK_ELEMENTS is None or g.ndim < 2 or g.size < 2 * CHUNK_ELEMENTS
      or not quantization.any_quantized(arrays)
      or any(_sharded(x) for x in jax.tree.leaves((g, arrays)))):
    return None
  rows = max(1, CHUNK_ELEMENTS // (g.size // g.shape[0]))
  return rows if rows < g.shape[0] else None


def _sharded(x) -> bool:
  """True if ``x`` is known to be split over devices (an explicit mesh axis).

  Slabs are for unsharded leaves: a slab of rows of a leaf split by rows
  would be gathered onto every device, and explicit shardings would have to
  be threaded through the loop. Under ``AxisType.Auto`` the sharding is not
  known while tracing (set ``CHUNK_ELEMENTS = None`` for row-sharded params).
  """
  try:
    spec = jax.typeof(x).sharding.spec
  except AttributeError:  # no sharding, or one without a spec (one device)
    return False
  return any(axis is not None for axis in spec)


def _states_by_rows(rule_on, g, p, arrays, rows: int):
  """``rule_on``'s new states, computed ``rows`` leading rows at a time.

  A ``fori_loop`` carries the states and writes each slab's new values over
  its old ones (``dynamic_update_slice``; slab i is read before it is
  written), then a last partial slab. The direction is not computed here.
  """
  def take(tree, start, size):
    return jax.tree.map(lambda x: lax.dynamic_slice_in_dim(x, start, size, 0), tree)

  def put(tree, new, start):
    return jax.tree.map(
        lambda x, y: lax.dynamic_update_slice_in_dim(x, y, start, 0), tree, new)

  def slab(start, size, states):
    # The barrier keeps XLA from hoisting the fp32 casts of g and p out of
    # the loop (a whole fp32 copy of each, seen on the CPU).
    g_slab, p_slab = lax.optimization_barrier(
        (take(g, start, size), take(p, start, size)))
    _, new = rule_on(g_slab, p_slab, tuple(take(a, start, size) for a in states))
    return tuple(put(a, b, start) for a, b in zip(states, new))

  n_full, tail = divmod(g.shape[0], rows)
  states = lax.fori_loop(0, n_full, lambda i, st: slab(i * rows, rows, st),
                         tuple(arrays))
  if tail:
    states = slab(n_full * rows, tail, states)
  return states


def cast_to_param_dtype() -> optax.GradientTransformation:
  """Casts each update to its param's dtype (a no-op without params).

  Ends our aliases so that an fp32 learning rate (``inject_hyperparams``)
  does not turn bf16 params' updates into fp32 ones.
  """
  def update_fn(updates, state, params=None):
    if params is None:
      return updates, state
    return jax.tree.map(lambda u, p: u.astype(jnp.result_type(p)),
                        updates, params), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def _alias(rule, learning_rate, hp, state_cls, state_init=None,
           state_dtypes=None):
  """The optimizer with its learning rate, carrying its fused form.

  ``chain(direction in fp32, scale_by_learning_rate, cast to the param
  dtype)``: the step ``-lr * direction`` is formed in fp32 as in the fused
  kernel, and the update has the param's dtype whatever the dtype of the
  learning rate (a Python float, bf16, or an fp32 array from
  ``optax.inject_hyperparams``).
  """
  full = {rules_lib.LEARNING_RATE: learning_rate, **hp}
  _validate(rule, full)
  tx = optax.chain(
      _scale_by_rule(rule, hp, state_cls, state_init, out_dtype=jnp.float32,
                     state_dtypes=state_dtypes),
      optax.scale_by_learning_rate(learning_rate),
      cast_to_param_dtype())
  return ForgeTransformation.create(tx, rule, full, state_init, state_dtypes)


class ScaleByAdamWState(NamedTuple):
  """State of :func:`scale_by_adamw`, :func:`scale_by_nadamw` and
  :func:`scale_by_radam`."""

  count: jax.Array  # int32 (), number of updates so far.
  mu: optax.Updates  # First moment, shaped like params: fp32, bf16 or a QuantizedArray (int8).
  nu: optax.Updates  # Second moment, shaped like params: fp32, bf16 or a QuantizedArray (int8).


def scale_by_adamw(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
  r"""AdamW's direction, decoupled weight decay included, without the learning rate.

  .. math::
    m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
    v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\quad
    u_t = \frac{m_t / (1-\beta_1^t)}{\sqrt{v_t / (1-\beta_2^t)} + \epsilon}
          + \lambda\, p_t

  The arithmetic is that of ``optax.scale_by_adam`` followed by
  ``optax.add_decayed_weights`` (evaluated in fp32 by
  ``forge_jax.rules.ADAMW``, the same definition the fused kernel runs).

  Args:
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to the denominator outside the square root.
    weight_decay: decoupled weight decay :math:`\lambda`.
    mu_dtype, nu_dtype: storage of the moments: ``None``/float32, bfloat16
      (rounded to nearest) or int8 (absmax blocks of 64 with an fp32 scale;
      ``nu`` through its square root, see :mod:`pallas_kernels.quantization`).
      The update is computed in fp32 whatever the storage.

  Returns:
    An ``optax.GradientTransformation`` with state :class:`ScaleByAdamWState`.
    Its ``update`` needs ``params``; updates keep each param's dtype.

  Raises:
    ValueError: for b1 or b2 outside [0, 1), negative eps or weight_decay, a
      state dtype other than float32, bfloat16 or int8.

  References:
    Loshchilov & Hutter, Decoupled Weight Decay Regularization,
    https://arxiv.org/abs/1711.05101
  """
  return _scale_by_rule(
      rules_lib.ADAMW, dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
      ScaleByAdamWState, state_dtypes=(mu_dtype, nu_dtype))


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> ForgeTransformation:
  """AdamW with the learning rate; usable in optax and fused in ForgeDense.

  Unfused it is ``scale_by_adamw(...)`` (kept in fp32), then
  ``optax.scale_by_learning_rate(learning_rate)``, then a cast to each
  param's dtype: numerically ``optax.adamw`` (the same names and defaults for
  the hyperparameters it has). Not taken: ``mask`` (a fused layer owns one
  kernel; give a layer that should not decay ``weight_decay=0.0``, or leave
  params out of an unfused ``tx`` with ``optax.masked``), ``eps_root`` and
  ``nesterov`` (use :func:`nadamw`); passing them raises a TypeError. Given
  to :class:`forge_jax.ForgeDense`, the same rule runs inside the backward
  pass.

  Args:
    learning_rate: a float or an optax schedule of the step count.
    b1, b2, eps, weight_decay, mu_dtype, nu_dtype: see :func:`scale_by_adamw`.

  Returns:
    A :class:`ForgeTransformation`.

  Examples:
    >>> import jax.numpy as jnp, optax, forge_jax
    >>> tx = forge_jax.adamw(optax.cosine_decay_schedule(1e-3, 100))
    >>> params = {'w': jnp.ones(3)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.ones(3)}, state, params)
  """
  hp = dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  return _alias(rules_lib.ADAMW, learning_rate, hp, ScaleByAdamWState,
                state_dtypes=(mu_dtype, nu_dtype))


def scale_by_nadamw(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                    weight_decay: float = 1e-4, *, mu_dtype: Any = None,
                    nu_dtype: Any = None) -> optax.GradientTransformation:
  r"""NAdam's direction with decoupled weight decay (``forge_jax.rules.NADAMW``).

  Adam's moments, the first corrected with Nesterov's look-ahead:
  :math:`\hat m_t = \beta_1 m_t / (1-\beta_1^{t+1}) + (1-\beta_1) g_t /
  (1-\beta_1^t)`; numerically ``optax.scale_by_adam(nesterov=True)`` then
  ``optax.add_decayed_weights``. State :class:`ScaleByAdamWState`, stored as
  ``mu_dtype``/``nu_dtype`` (see :func:`scale_by_adamw`).

  References:
    Dozat, Incorporating Nesterov Momentum into Adam, ICLR workshop 2016.
  """
  return _scale_by_rule(
      rules_lib.NADAMW, dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
      ScaleByAdamWState, state_dtypes=(mu_dtype, nu_dtype))


def nadamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8, weight_decay: float = 1e-4, *,
           mu_dtype: Any = None, nu_dtype: Any = None) -> ForgeTransformation:
  """NAdamW; numerically ``optax.nadamw`` (the same names and defaults for the
  hyperparameters it has; no ``mask`` or ``eps_root``, as :func:`adamw`)."""
  hp = dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  return _alias(rules_lib.NADAMW, learning_rate, hp, ScaleByAdamWState,
                state_dtypes=(mu_dtype, nu_dtype))


def scale_by_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   threshold: float = 5.0, weight_decay: float = 0.0, *,
                   mu_dtype: Any = None, nu_dtype: Any = None,
                   ) -> optax.GradientTransformation:
  r"""Rectified Adam's direction (``forge_jax.rules.RADAM``).

  :math:`\rho_t = \rho_\infty - 2t\beta_2^t/(1-\beta_2^t)`; below
  ``threshold`` the step is the bias-corrected momentum, above it Adam's step
  times the rectification :math:`r_t`. Numerically ``optax.scale_by_radam``
  (plus decoupled weight decay, 0 by default). State :class:`ScaleByAdamWState`,
  stored as ``mu_dtype``/``nu_dtype`` (see :func:`scale_by_adamw`).

  References:
    Liu et al., On the Variance of the Adaptive Learning Rate and Beyond,
    https://arxiv.org/abs/1908.03265
  """
  return _scale_by_rule(
      rules_lib.RADAM, dict(b1=b1, b2=b2, eps=eps, threshold=threshold,
                            weight_decay=weight_decay), ScaleByAdamWState,
      state_dtypes=(mu_dtype, nu_dtype))


def radam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, threshold: float = 5.0,
          weight_decay: float = 0.0, *, mu_dtype: Any = None,
          nu_dtype: Any = None) -> ForgeTransformation:
  """RAdam; numerically ``optax.radam`` when ``weight_decay=0``."""
  hp = dict(b1=b1, b2=b2, eps=eps, threshold=threshold, weight_decay=weight_decay)
  return _alias(rules_lib.RADAM, learning_rate, hp, ScaleByAdamWState,
                state_dtypes=(mu_dtype, nu_dtype))


class ScaleByLionState(NamedTuple):
  """State of :func:`scale_by_lion`."""

  count: jax.Array  # int32 (), number of updates so far.
  mu: optax.Updates  # Momentum, shaped like params: fp32, bf16 or a QuantizedArray (int8).


def scale_by_lion(b1: float = 0.9, b2: float = 0.99, weight_decay: float = 1e-3,
                  *, mu_dtype: Any = None) -> optax.GradientTransformation:
  r"""Lion's direction (``forge_jax.rules.LION``).

  :math:`u_t = \mathrm{sign}((1-\beta_1) g_t + \beta_1 m_{t-1}) + \lambda p_t`,
  :math:`m_t = (1-\beta_2) g_t + \beta_2 m_{t-1}`; numerically
  ``optax.scale_by_lion`` then ``optax.add_decayed_weights``. ``mu`` is
  stored as ``mu_dtype`` (float32, bfloat16 or int8).

  References:
    Chen et al., Symbolic Discovery of Optimization Algorithms,
    https://arxiv.org/abs/2302.06675
  """
  return _scale_by_rule(rules_lib.LION,
                        dict(b1=b1, b2=b2, weight_decay=weight_decay),
                        ScaleByLionState, state_dtypes=(mu_dtype,))


def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
         weight_decay: float = 1e-3, *, mu_dtype: Any = None,
         ) -> ForgeTransformation:
  """Lion; numerically ``optax.lion`` (the same names and defaults for the
  hyperparameters it has; no ``mask``, as :func:`adamw`)."""
  hp = dict(b1=b1, b2=b2, weight_decay=weight_decay)
  return _alias(rules_lib.LION, learning_rate, hp, ScaleByLionState,
                state_dtypes=(mu_dtype,))


class ScaleByRmsState(NamedTuple):
  """State of :func:`scale_by_rms`."""

  count: jax.Array  # int32 (), number of updates so far.
  nu: optax.Updates  # Moving average of g², shaped like params: fp32, bf16 or a QuantizedArray (int8).


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8,
                 weight_decay: float = 0.0, *,
                 nu_dtype: Any = None) -> optax.GradientTransformation:
  r"""RMSprop's direction (``forge_jax.rules.RMSPROP``).

  :math:`\nu_t = \delta \nu_{t-1} + (1-\delta) g_t^2`,
  :math:`u_t = g_t / \sqrt{\nu_t + \epsilon}`; numerically
  ``optax.scale_by_rms`` (eps inside the root, no bias correction, initial
  scale 0). ``nu`` is stored as ``nu_dtype`` (float32, bfloat16 or int8).

  References:
    Tieleman & Hinton, Lecture 6.5 - RMSProp, COURSERA 2012.
  """
  return _scale_by_rule(rules_lib.RMSPROP,
                        dict(decay=decay, eps=eps, weight_decay=weight_decay),
                        ScaleByRmsState, state_dtypes=(nu_dtype,))


def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9,
            eps: float = 1e-8, weight_decay: float = 0.0, *,
            nu_dtype: Any = None) -> ForgeTransformation:
  """RMSprop; numerically ``optax.rmsprop`` with its defaults."""
  hp = dict(decay=decay, eps=eps, weight_decay=weight_decay)
  return _alias(rules_lib.RMSPROP, learning_rate, hp, ScaleByRmsState,
                state_dtypes=(nu_dtype,))


class ScaleByRssState(NamedTuple):
  """State of :func:`scale_by_rss`."""

  count: jax.Array  # int32 (), number of updates so far.
  sum_of_squares: optax.Updates  # Sum of g², shaped like params: fp32, bf16 or a QuantizedArray (int8).


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7,
                 weight_decay: float = 0.0, *, sum_of_squares_dtype: Any = None,
                 ) -> optax.GradientTransformation:
  r"""AdaGrad's direction (``forge_jax.rules.ADAGRAD``).

  :math:`s_t = s_{t-1} + g_t^2` from ``initial_accumulator_value``,
  :math:`u_t = g_t / \sqrt{s_t + \epsilon}`; numerically ``optax.scale_by_rss``.
  The sum is stored as ``sum_of_squares_dtype`` (float32, bfloat16 or int8).

  References:
    Duchi et al., Adaptive Subgradient Methods, JMLR 2011.
  """
  return _scale_by_rule(rules_lib.ADAGRAD, dict(eps=eps, weight_decay=weight_decay),
                        ScaleByRssState, (initial_accumulator_value,),
                        state_dtypes=(sum_of_squares_dtype,))


def adagrad(learning_rate: ScalarOrSchedule,
            initial_accumulator_value: float = 0.1, eps: float = 1e-7,
            weight_decay: float = 0.0, *,
            sum_of_squares_dtype: Any = None) -> ForgeTransformation:
  """AdaGrad; numerically ``optax.adagrad`` (same names and defaults)."""
  if initial_accumulator_value is None or callable(initial_accumulator_value):
    raise ValueError("initial_accumulator_value must be a number >= 0, got "
                     f"{initial_accumulator_value!r}")
  if (not isinstance(initial_accumulator_value, jax.core.Tracer)
      and not float(initial_accumulator_value) >= 0):
    raise ValueError(f"initial_accumulator_value={initial_accumulator_value} "
                     "must be >= 0")
  hp = dict(eps=eps, weight_decay=weight_decay)
  return _alias(rules_lib.ADAGRAD, learning_rate, hp, ScaleByRssState,
                (initial_accumulator_value,),
                state_dtypes=(sum_of_squares_dtype,))


class ScaleBySgdState(NamedTuple):
  """State of :func:`scale_by_sgd`."""

  count: jax.Array  # int32 (), number of updates so far.


class ScaleByMomentumState(NamedTuple):
  """State of :func:`scale_by_momentum`."""

  count: jax.Array  # int32 (), number of updates so far.
  trace: optax.Updates  # Momentum buffer, shaped like params: fp32, bf16 or a QuantizedArray (int8).


def scale_by_sgd(weight_decay: float = 0.0) -> optax.GradientTransformation:
  """Plain SGD's direction, ``g + weight_decay * param`` (``rules.SGD``)."""
  return _scale_by_rule(rules_lib.SGD, dict(weight_decay=weight_decay),
                        ScaleBySgdState)


def scale_by_momentum(momentum: float = 0.9, nesterov: bool = False,
                      weight_decay: float = 0.0, *,
                      accumulator_dtype: Any = None,
                      ) -> optax.GradientTransformation:
  r"""SGD momentum's direction (``rules.SGD_MOMENTUM`` / ``SGD_NESTEROV``).

  :math:`b_t = g_t + \mu b_{t-1}`; the direction is :math:`b_t`, or with
  Nesterov :math:`g_t + \mu b_t`; numerically ``optax.trace``. The trace
  is stored as ``accumulator_dtype`` (optax's name; float32, bfloat16, int8).
  """
  rule = rules_lib.SGD_NESTEROV if nesterov else rules_lib.SGD_MOMENTUM
  return _scale_by_rule(rule, dict(momentum=momentum, weight_decay=weight_decay),
                        ScaleByMomentumState, state_dtypes=(accumulator_dtype,))


def sgd(learning_rate: ScalarOrSchedule, momentum: float | None = None,
        nesterov: bool = False, weight_decay: float = 0.0, *,
        accumulator_dtype: Any = None) -> ForgeTransformation:
  """SGD, with momentum (optionally Nesterov) when ``momentum`` is given.

  Numerically ``optax.sgd`` (same names) when ``weight_decay=0``; the
  momentum ``trace`` is stored as ``accumulator_dtype``.

  Raises:
    ValueError: for ``nesterov=True`` or ``accumulator_dtype`` without
      ``momentum``.
  """
  if momentum is None:
    if nesterov:
      raise ValueError("nesterov=True needs a momentum")
    if accumulator_dtype is not None:
      raise ValueError("accumulator_dtype needs a momentum (plain SGD has no "
                       "state)")
    hp = dict(weight_decay=weight_decay)
    return _alias(rules_lib.SGD, learning_rate, hp, ScaleBySgdState)
  hp = dict(momentum=momentum, weight_decay=weight_decay)
  rule = rules_lib.SGD_NESTEROV if nesterov else rules_lib.SGD_MOMENTUM
  return _alias(rule, learning_rate, hp, ScaleByMomentumState,
                state_dtypes=(accumulator_dtype,))

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
import optax

from forge_jax._src import rules as rules_lib

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class _FusedUpdate:
  """The ``update`` function of a ForgeTransformation, carrying its rule."""

  fn: Callable[..., Any]
  rule: rules_lib.ElementwiseRule
  hyperparams: Mapping[str, ScalarOrSchedule]

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
             hyperparams: Mapping[str, ScalarOrSchedule]) -> "ForgeTransformation":
    """Wraps ``tx`` (which must compute ``rule``) with its fused description."""
    missing = set(rule.hyperparam_names) - set(hyperparams)
    if missing:
      raise ValueError(f"hyperparams is missing {sorted(missing)}")
    tx = optax.with_extra_args_support(tx)
    return cls(tx.init, _FusedUpdate(tx.update, rule, dict(hyperparams)))

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


class ScaleByAdamWState(NamedTuple):
  """State of :func:`scale_by_adamw`."""

  count: jax.Array  # int32 (), number of updates so far.
  mu: optax.Updates  # First moment, fp32, shaped like params.
  nu: optax.Updates  # Second moment, fp32, shaped like params.


def scale_by_adamw(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
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

  Returns:
    An ``optax.GradientTransformation`` with state :class:`ScaleByAdamWState`.
    Its ``update`` needs ``params``; updates keep each param's dtype.

  References:
    Loshchilov & Hutter, Decoupled Weight Decay Regularization,
    https://arxiv.org/abs/1711.05101
  """
  rule = rules_lib.ADAMW
  hp = {"learning_rate": 0.0, "b1": b1, "b2": b2, "eps": eps,
        "weight_decay": weight_decay}
  _validate(rule, hp)

  def init_fn(params):
    zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)  # noqa: E731
    return ScaleByAdamWState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(zeros, params),
        nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("scale_by_adamw needs params (for weight decay): call "
                       "update(updates, state, params)")
    count = optax.safe_increment(state.count)
    hpv = rule.hyperparams_f32(hp)
    count_f = count.astype(jnp.float32)

    def leaf(g, p, mu, nu):
      direction, (mu, nu) = rule.direction(
          g.astype(jnp.float32), p.astype(jnp.float32), (mu, nu), hpv, count_f)
      return direction.astype(p.dtype), mu, nu

    out = jax.tree.map(leaf, updates, params, state.mu, state.nu)
    treedef = jax.tree.structure(updates)
    direction, mu, nu = (jax.tree.unflatten(treedef, leaves) for leaves in
                         zip(*treedef.flatten_up_to(out)))
    return direction, ScaleByAdamWState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
) -> ForgeTransformation:
  """AdamW with the learning rate; usable in optax and fused in ForgeDense.

  Unfused it is ``optax.chain(scale_by_adamw(...),
  optax.scale_by_learning_rate(learning_rate))``, numerically
  ``optax.adamw`` (same hyperparameter names and defaults). Given to
  :class:`forge_jax.ForgeDense`, the same rule runs inside the backward pass.

  Args:
    learning_rate: a float or an optax schedule of the step count.
    b1, b2, eps, weight_decay: see :func:`scale_by_adamw`.

  Returns:
    A :class:`ForgeTransformation`.

  Examples:
    >>> import jax.numpy as jnp, optax, forge_jax
    >>> tx = forge_jax.adamw(optax.cosine_decay_schedule(1e-3, 100))
    >>> params = {'w': jnp.ones(3)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'w': jnp.ones(3)}, state, params)
  """
  hp = {"learning_rate": learning_rate, "b1": b1, "b2": b2, "eps": eps,
        "weight_decay": weight_decay}
  _validate(rules_lib.ADAMW, hp)
  tx = optax.chain(
      scale_by_adamw(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay),
      optax.scale_by_learning_rate(learning_rate))
  return ForgeTransformation.create(tx, rules_lib.ADAMW, hp)

"""Elementwise optimizer update rules: the single definition of each optimizer.

An :class:`ElementwiseRule` is a pure function of fp32 arrays of one shape (a
whole parameter or one register tile of it): the gradient, the parameter, the
optimizer-state arrays, the hyperparameters and the step count. It is called
by three users, which is why fused and unfused training agree by
construction:

* the optax transforms in :mod:`forge_jax._src.transforms` (on whole leaves),
* the XLA reference of the fused weight-gradient op
  (:func:`pallas_kernels.fused_dw.fused_dw_update_reference`),
* the epilogue of the Pallas kernel (on one (block_m, block_n) tile).

The rule returns a *direction*; the new parameter is always
``param + direction * (-learning_rate)``, the same arithmetic as
``optax.scale_by_learning_rate`` followed by ``optax.apply_updates``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
# (grad, param, state, hyperparams, count) -> (direction, new_state)
DirectionFn = Callable[
    [Array, Array, tuple[Array, ...], Mapping[str, Array], Array],
    tuple[Array, tuple[Array, ...]],
]

LEARNING_RATE = "learning_rate"


@dataclasses.dataclass(frozen=True)
class ElementwiseRule:
  """An optimizer whose update of each element depends on that element only.

  Attributes:
    name: short name, e.g. ``'adamw'``.
    state_names: names of the per-element state arrays, in order (optax
      names: ``('mu', 'nu')`` for Adam). Each has the parameter's shape.
    hyperparam_names: names of the scalar hyperparameters, in order. The first
      is always ``'learning_rate'``.
    direction: ``direction(grad, param, state, hyperparams, count) ->
      (direction, new_state)``; all arrays fp32 of one shape, ``state`` a tuple
      ordered like ``state_names``, ``hyperparams`` a mapping from
      ``hyperparam_names`` to fp32 scalars, ``count`` the fp32 step count
      after increment (1 at the first step).
  """

  name: str
  state_names: tuple[str, ...]
  hyperparam_names: tuple[str, ...]
  direction: DirectionFn

  def __post_init__(self):
    if not self.hyperparam_names or self.hyperparam_names[0] != LEARNING_RATE:
      raise ValueError(
          f"{self.hyperparam_names=} must start with {LEARNING_RATE!r}")

  @property
  def num_hyperparams(self) -> int:
    """Length of the packed hyperparameter vector (hyperparameters + count)."""
    return len(self.hyperparam_names) + 1

  def update(
      self,
      grad: Array,
      param: Array,
      state: Sequence[Array],
      hyperparams: Mapping[str, Array],
      count: Array,
  ) -> tuple[Array, tuple[Array, ...]]:
    """One fp32 step: returns ``(new_param, new_state)``, both fp32."""
    direction, new_state = self.direction(
        grad, param, tuple(state), hyperparams, count)
    new_param = param + direction * (-hyperparams[LEARNING_RATE])
    return new_param, new_state

  def unpack(self, hparams: Array | Sequence[Array]):
    """Splits a packed vector ``[*hyperparams, count]`` into (mapping, count)."""
    values = [hparams[i] for i in range(self.num_hyperparams)]
    return dict(zip(self.hyperparam_names, values[:-1])), values[-1]

  def pack(self, hyperparams: Mapping[str, Any], count: Any) -> Array:
    """Packs hyperparameters and the step count into one fp32 vector.

    Raises:
      ValueError: if a hyperparameter is missing or not a scalar.
    """
    missing = [n for n in self.hyperparam_names if n not in hyperparams]
    if missing:
      raise ValueError(f"hyperparams is missing {missing} for rule {self.name!r}")
    values = []
    for n in self.hyperparam_names:
      v = jnp.asarray(hyperparams[n], jnp.float32)
      if v.ndim != 0:
        raise ValueError(f"hyperparameter {n!r} must be a scalar, got {v.shape=}")
      values.append(v)
    values.append(jnp.asarray(count, jnp.float32))
    return jnp.stack(values)


def _adamw_direction(grad, param, state, hp, count):
  """AdamW (Loshchilov & Hutter, arXiv 1711.05101), optax's arithmetic.

  mu <- b1 mu + (1 - b1) g;  nu <- b2 nu + (1 - b2) g^2;
  direction = mu / (1 - b1^t) / (sqrt(nu / (1 - b2^t)) + eps) + wd * param.
  """
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = (1 - b1) * grad + b1 * mu
  nu = (1 - b2) * (grad * grad) + b2 * nu
  mu_hat = mu / (1 - b1**count)
  nu_hat = nu / (1 - b2**count)
  direction = mu_hat / (jnp.sqrt(nu_hat) + hp["eps"]) + hp["weight_decay"] * param
  return direction, (mu, nu)


ADAMW = ElementwiseRule(
    name="adamw",
    state_names=("mu", "nu"),
    hyperparam_names=("learning_rate", "b1", "b2", "eps", "weight_decay"),
    direction=_adamw_direction,
)

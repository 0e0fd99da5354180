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
    hyperparam_names: names of the user-facing scalar hyperparameters, in
      order. The first is always ``'learning_rate'``.
    derived: name -> function of the raw hyperparameter mapping, for
      constants worth computing before the fp32 cast (``1 - b2`` in double
      precision when ``b2`` is a Python float, as optax computes it).
    direction: ``direction(grad, param, state, hyperparams, count) ->
      (direction, new_state)``; all arrays fp32 of one shape, ``state`` a tuple
      ordered like ``state_names``, ``hyperparams`` a mapping from
      ``packed_names`` to fp32 scalars, ``count`` the fp32 step count after
      increment (1 at the first step).
    check: validates concrete hyperparameter values; raises ValueError naming
      the offending one.
  """

  name: str
  state_names: tuple[str, ...]
  hyperparam_names: tuple[str, ...]
  direction: DirectionFn
  derived: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = ()
  check: Callable[[Mapping[str, Any]], None] = lambda hp: None

  def __post_init__(self):
    if not self.hyperparam_names or self.hyperparam_names[0] != LEARNING_RATE:
      raise ValueError(
          f"{self.hyperparam_names=} must start with {LEARNING_RATE!r}")

  @property
  def packed_names(self) -> tuple[str, ...]:
    """Hyperparameters followed by the derived constants."""
    return self.hyperparam_names + tuple(n for n, _ in self.derived)

  @property
  def num_hyperparams(self) -> int:
    """Length of the packed vector ``[*packed_names, count]``."""
    return len(self.packed_names) + 1

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

  def hyperparams_f32(self, raw: Mapping[str, Any]) -> dict[str, Array]:
    """fp32 scalars for ``packed_names`` from raw values (floats or arrays).

    Raises:
      ValueError: if a hyperparameter is missing, not a real scalar, or out
        of range (``check``).
    """
    missing = [n for n in self.hyperparam_names if n not in raw]
    if missing:
      raise ValueError(f"hyperparams is missing {missing} for rule {self.name!r}")
    out = {}
    for n in self.hyperparam_names:
      out[n] = _real_scalar(n, raw[n])
    concrete = {n: v for n, v in raw.items() if not isinstance(v, jax.core.Tracer)}
    self.check(concrete)
    for n, fn in self.derived:
      out[n] = jnp.asarray(fn(raw), jnp.float32)
    return out

  def unpack(self, hparams: Array | Sequence[Array]):
    """Splits a packed vector ``[*packed_names, count]`` into (mapping, count)."""
    values = [hparams[i] for i in range(self.num_hyperparams)]
    return dict(zip(self.packed_names, values[:-1])), values[-1]

  def pack(self, hyperparams: Mapping[str, Any], count: Any) -> Array:
    """Packs hyperparameters, derived constants and the step count (fp32).

    Raises:
      ValueError: as :meth:`hyperparams_f32`.
    """
    hp = self.hyperparams_f32(hyperparams)
    return jnp.stack([hp[n] for n in self.packed_names]
                     + [jnp.asarray(count, jnp.float32)])


def _real_scalar(name: str, value: Any) -> Array:
  if value is None or callable(value):
    raise ValueError(f"hyperparameter {name!r} must be a real scalar, got "
                     f"{type(value).__name__}")
  try:
    v = jnp.asarray(value)
  except TypeError as e:
    raise ValueError(f"hyperparameter {name!r} must be a real scalar, got "
                     f"{type(value).__name__}") from e
  if v.ndim != 0:
    raise ValueError(f"hyperparameter {name!r} must be a scalar, got {v.shape=}")
  if not (jnp.issubdtype(v.dtype, jnp.floating)
          or jnp.issubdtype(v.dtype, jnp.integer)):
    raise ValueError(f"hyperparameter {name!r} must be real, got {v.dtype}")
  return v.astype(jnp.float32)


def _check_adam(hp: Mapping[str, Any]) -> None:
  for n in ("b1", "b2"):
    if n in hp and not 0.0 <= float(hp[n]) < 1.0:
      raise ValueError(f"{n}={float(hp[n])} must be in [0, 1)")
  for n in ("eps", "weight_decay"):
    if n in hp and not float(hp[n]) >= 0.0:
      raise ValueError(f"{n}={float(hp[n])} must be >= 0")


def _adamw_direction(grad, param, state, hp, count):
  """AdamW (Loshchilov & Hutter, arXiv 1711.05101), optax's arithmetic.

  mu <- b1 mu + (1 - b1) g;  nu <- b2 nu + (1 - b2) g^2;
  direction = mu / (1 - b1^t) / (sqrt(nu / (1 - b2^t)) + eps) + wd * param.
  """
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = hp["one_minus_b1"] * grad + b1 * mu
  nu = hp["one_minus_b2"] * (grad * grad) + b2 * nu
  mu_hat = mu / (1 - b1**count)
  nu_hat = nu / (1 - b2**count)
  direction = mu_hat / (jnp.sqrt(nu_hat) + hp["eps"]) + hp["weight_decay"] * param
  return direction, (mu, nu)


ADAMW = ElementwiseRule(
    name="adamw",
    state_names=("mu", "nu"),
    hyperparam_names=("learning_rate", "b1", "b2", "eps", "weight_decay"),
    direction=_adamw_direction,
    # optax computes (1 - b) from the Python float, in double precision.
    derived=(("one_minus_b1", lambda hp: 1 - hp["b1"]),
             ("one_minus_b2", lambda hp: 1 - hp["b2"])),
    check=_check_adam,
)

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
from jax import lax
import numpy as np

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
    nonnegative_states: the states that are never negative (second moments,
      sums of squares); stored as int8 they use the square-root code of
      :mod:`pallas_kernels.quantization`, the others the signed one.
  """

  name: str
  state_names: tuple[str, ...]
  hyperparam_names: tuple[str, ...]
  direction: DirectionFn
  derived: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = ()
  check: Callable[[Mapping[str, Any]], None] = lambda hp: None
  nonnegative_states: tuple[str, ...] = ()

  def __post_init__(self):
    unknown = set(self.nonnegative_states) - set(self.state_names)
    if unknown:
      raise ValueError(f"nonnegative_states {sorted(unknown)} are not in "
                       f"{self.state_names=}")
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

  # The interface the fused kernel and its reference use, shared with
  # non-elementwise rules whose state is smaller than the parameter
  # (forge_jax._src.fold.FoldAdamRule).

  min_block_n = 16  # narrowest kernel tile along the out axis

  def state_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of each state array of a parameter of ``shape`` (the same)."""
    return tuple(shape)

  def state_cols(self, cols: int) -> int:
    """State columns of a tile ``cols`` wide (the same)."""
    return cols

  def update_masked(self, grad, param, state, hyperparams, count, col_valid=None):
    """:meth:`update`; ``col_valid`` (which columns are real) is not needed
    by an elementwise rule."""
    del col_valid
    return self.update(grad, param, state, hyperparams, count)

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
    check_learning_rate(concrete)
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

    ``count`` is the 1-based number of this update (optax's ``count`` after
    its increment): 1 on the first step; bias corrections divide by
    ``1 - b**count``, which is 0 at count 0.

    Raises:
      ValueError: as :meth:`hyperparams_f32`, or for a concrete ``count``
        below 1 or NaN (a traced count is not checked).
    """
    check_count(count)
    hp = self.hyperparams_f32(hyperparams)
    return jnp.stack([hp[n] for n in self.packed_names]
                     + [jnp.asarray(count, jnp.float32)])


def check_learning_rate(raw: Mapping[str, Any]) -> None:
  """Raises ValueError for a concrete ``raw['learning_rate']`` that is
  negative, NaN or not finite in fp32 (the kernels' precision); a traced
  one, or none, is not checked."""
  lr = raw.get("learning_rate")
  if lr is None or isinstance(lr, jax.core.Tracer):
    return
  with np.errstate(over="ignore"):
    v = np.asarray(lr, np.float64).reshape(())
    v32 = np.float32(v)
  if not (v >= 0 and np.isfinite(v32)):  # NaN too
    raise ValueError(f"learning_rate={float(v)} must be >= 0 and finite in "
                     "float32 (for gradient ascent, negate the loss)")


def check_count(count: Any) -> None:
  """Raises ValueError for a concrete ``count`` below 1 or NaN (the 1-based
  number of an update); a traced count is not checked."""
  if not isinstance(count, jax.core.Tracer):
    c = np.asarray(count)
    if c.size == 1 and not float(c.reshape(())) >= 1:  # NaN too
      raise ValueError(
          f"count={float(c.reshape(())):g}: the 1-based number of this update is "
          "expected (1 on the first step, optax's count after its increment)")


def _real_scalar(name: str, value: Any) -> Array:
  if value is None or callable(value) or isinstance(value, (str, bytes)):
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


def _check_range(**ranges):
  """A ``check`` for hyperparameters that must lie in [low, high)."""
  def check(hp: Mapping[str, Any]) -> None:
    for n, (low, high) in ranges.items():
      if n in hp and not low <= float(hp[n]) < high:
        raise ValueError(f"{n}={float(hp[n])} must be in [{low}, {high})")
    if "weight_decay" in hp and not float(hp["weight_decay"]) >= 0.0:
      raise ValueError(f"weight_decay={float(hp['weight_decay'])} must be >= 0")
  return check


def _second_moment(grad, nu, hp):
  """b2 nu + (1 - b2) g², as (sqrt(1 - b2) g)² so that |g| up to ~1e20
  (whose square overflows fp32) still gives a finite moment."""
  scaled = hp["sqrt_one_minus_b2"] * grad
  return scaled * scaled + hp["b2"] * nu


def _root_nu_hat(nu, b2_t):
  """sqrt(nu / (1 - b2^t)), as sqrt(nu) · rsqrt(1 - b2^t) (no overflow).

  The bias corrections here and in the rules below multiply by a reciprocal
  of the step's scalar instead of dividing each element by it: the
  reciprocal depends on the hyperparameters and the count only, so the
  kernels compute it once per call (see ``kernel_mosaic``'s "Rule
  arithmetic") and each element pays a multiplication, not a division (at
  most an ulp from optax's quotient)."""
  return jnp.sqrt(nu) * lax.rsqrt(1 - b2_t)


def _adamw_direction(grad, param, state, hp, count):
  """AdamW (Loshchilov & Hutter, arXiv 1711.05101), optax's arithmetic.

  mu <- b1 mu + (1 - b1) g;  nu <- b2 nu + (1 - b2) g^2;
  direction = mu / (1 - b1^t) / (sqrt(nu / (1 - b2^t)) + eps) + wd * param,
  with the squares and the root taken so that a first gradient up to ~1e20
  (at b2 = 0.999) gives a finite step, about -lr * sign(g), where a plain g²
  would overflow fp32. A gradient that stays that large still overflows the
  second moment after some tens of steps, as in optax.
  """
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = hp["one_minus_b1"] * grad + b1 * mu
  nu = _second_moment(grad, nu, hp)
  mu_hat = mu * (1 / (1 - b1**count))
  direction = mu_hat / (_root_nu_hat(nu, b2**count) + hp["eps"])
  return direction + hp["weight_decay"] * param, (mu, nu)


_ADAM_RANGES = _check_range(b1=(0.0, 1.0), b2=(0.0, 1.0), eps=(0.0, float("inf")))

_ONE_MINUS_B = (("one_minus_b1", lambda hp: 1 - hp["b1"]),
                ("one_minus_b2", lambda hp: 1 - hp["b2"]),
                ("sqrt_one_minus_b2", lambda hp: (1 - hp["b2"]) ** 0.5))

ADAMW = ElementwiseRule(
    name="adamw",
    state_names=("mu", "nu"),
    hyperparam_names=("learning_rate", "b1", "b2", "eps", "weight_decay"),
    direction=_adamw_direction,
    # optax computes (1 - b) from the Python float, in double precision.
    derived=_ONE_MINUS_B,
    check=_ADAM_RANGES,
    nonnegative_states=("nu",),
)


def _nadamw_direction(grad, param, state, hp, count):
  """NAdam with decoupled weight decay (Dozat 2016), optax's arithmetic.

  Adam's moments; the first is corrected with Nesterov's look-ahead:
  mu_hat = b1 mu / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t).
  """
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = hp["one_minus_b1"] * grad + b1 * mu
  nu = _second_moment(grad, nu, hp)
  mu_hat = (b1 * (mu * (1 / (1 - b1**(count + 1))))
            + hp["one_minus_b1"] * (grad * (1 / (1 - b1**count))))
  direction = mu_hat / (_root_nu_hat(nu, b2**count) + hp["eps"])
  return direction + hp["weight_decay"] * param, (mu, nu)


def _radam_direction(grad, param, state, hp, count):
  """Rectified Adam (Liu et al., arXiv 1908.03265), optax's arithmetic.

  rho_t = rho_inf - 2 t b2^t / (1 - b2^t); while rho_t < threshold the step
  is the bias-corrected momentum alone, then Adam's step times the
  rectification r_t.
  """
  mu, nu = state
  b1, b2 = hp["b1"], hp["b2"]
  mu = hp["one_minus_b1"] * grad + b1 * mu
  nu = _second_moment(grad, nu, hp)
  b2t = b2**count
  ro = hp["ro_inf"] - 2 * count * b2t / (1 - b2t)
  mu_hat = mu * (1 / (1 - b1**count))
  r = jnp.sqrt((ro - 4.0) * (ro - 2.0) * hp["ro_inf"] / (hp["ro_denominator"] * ro))
  adam = r * mu_hat / (_root_nu_hat(nu, b2t) + hp["eps"])
  direction = jnp.where(ro >= hp["threshold"], adam, mu_hat)
  return direction + hp["weight_decay"] * param, (mu, nu)


def _lion_direction(grad, param, state, hp, count):
  """Lion (Chen et al., arXiv 2302.06675), optax's arithmetic.

  direction = sign((1 - b1) g + b1 mu) + wd * param;
  mu <- (1 - b2) g + b2 mu.
  """
  del count
  (mu,) = state
  direction = jnp.sign(hp["one_minus_b1"] * grad + hp["b1"] * mu)
  mu = hp["one_minus_b2"] * grad + hp["b2"] * mu
  return direction + hp["weight_decay"] * param, (mu,)


def _rmsprop_direction(grad, param, state, hp, count):
  """RMSprop (Tieleman & Hinton 2012), optax.rmsprop's arithmetic.

  nu <- decay nu + (1 - decay) g^2;  direction = g / sqrt(nu + eps).
  """
  del count
  (nu,) = state
  nu = hp["one_minus_decay"] * (grad * grad) + hp["decay"] * nu
  direction = lax.rsqrt(nu + hp["eps"]) * grad
  return direction + hp["weight_decay"] * param, (nu,)


def _adagrad_direction(grad, param, state, hp, count):
  """AdaGrad (Duchi et al. 2011), optax.adagrad's arithmetic.

  sum_of_squares <- sum_of_squares + g^2;
  direction = g / sqrt(sum_of_squares + eps) (0 where the sum is 0).
  """
  del count
  (sum_of_squares,) = state
  sum_of_squares = grad * grad + sum_of_squares
  scale = jnp.where(sum_of_squares > 0,
                    lax.rsqrt(sum_of_squares + hp["eps"]), 0.0)
  return scale * grad + hp["weight_decay"] * param, (sum_of_squares,)


def _sgd_direction(grad, param, state, hp, count):
  """Plain SGD: direction = g + wd * param."""
  del state, count
  return grad + hp["weight_decay"] * param, ()


def _momentum_direction(nesterov: bool):
  def direction_fn(grad, param, state, hp, count):
    """SGD with (Nesterov) momentum, optax.trace's arithmetic.

    trace <- g + momentum * trace; direction = trace, or with Nesterov
    g + momentum * trace (the new trace).
    """
    del count
    (trace,) = state
    trace = grad + hp["momentum"] * trace
    direction = grad + hp["momentum"] * trace if nesterov else trace
    return direction + hp["weight_decay"] * param, (trace,)
  return direction_fn


NADAMW = ElementwiseRule(
    name="nadamw",
    state_names=("mu", "nu"),
    hyperparam_names=("learning_rate", "b1", "b2", "eps", "weight_decay"),
    direction=_nadamw_direction,
    derived=_ONE_MINUS_B,
    check=_ADAM_RANGES,
    nonnegative_states=("nu",),
)

RADAM = ElementwiseRule(
    name="radam",
    state_names=("mu", "nu"),
    hyperparam_names=("learning_rate", "b1", "b2", "eps", "threshold",
                      "weight_decay"),
    direction=_radam_direction,
    derived=_ONE_MINUS_B + (
        ("ro_inf", lambda hp: 2.0 / (1.0 - hp["b2"]) - 1.0),
        ("ro_denominator", lambda hp: ((2.0 / (1.0 - hp["b2"]) - 5.0)
                                       * (2.0 / (1.0 - hp["b2"]) - 3.0)))),
    check=_ADAM_RANGES,
    nonnegative_states=("nu",),
)

LION = ElementwiseRule(
    name="lion",
    state_names=("mu",),
    hyperparam_names=("learning_rate", "b1", "b2", "weight_decay"),
    direction=_lion_direction,
    derived=_ONE_MINUS_B,
    check=_check_range(b1=(0.0, 1.0), b2=(0.0, 1.0)),
)

RMSPROP = ElementwiseRule(
    name="rmsprop",
    state_names=("nu",),
    hyperparam_names=("learning_rate", "decay", "eps", "weight_decay"),
    direction=_rmsprop_direction,
    derived=(("one_minus_decay", lambda hp: 1 - hp["decay"]),),
    check=_check_range(decay=(0.0, 1.0), eps=(0.0, float("inf"))),
    nonnegative_states=("nu",),
)

ADAGRAD = ElementwiseRule(
    name="adagrad",
    state_names=("sum_of_squares",),
    hyperparam_names=("learning_rate", "eps", "weight_decay"),
    direction=_adagrad_direction,
    check=_check_range(eps=(0.0, float("inf"))),
    nonnegative_states=("sum_of_squares",),
)

SGD = ElementwiseRule(
    name="sgd",
    state_names=(),
    hyperparam_names=("learning_rate", "weight_decay"),
    direction=_sgd_direction,
    check=_check_range(),
)

SGD_MOMENTUM = ElementwiseRule(
    name="sgd_momentum",
    state_names=("trace",),
    hyperparam_names=("learning_rate", "momentum", "weight_decay"),
    direction=_momentum_direction(nesterov=False),
    check=_check_range(momentum=(0.0, 1.0)),
)

SGD_NESTEROV = ElementwiseRule(
    name="sgd_nesterov",
    state_names=("trace",),
    hyperparam_names=("learning_rate", "momentum", "weight_decay"),
    direction=_momentum_direction(nesterov=True),
    check=_check_range(momentum=(0.0, 1.0)),
)

ALL_RULES = (ADAMW, NADAMW, RADAM, LION, RMSPROP, ADAGRAD, SGD, SGD_MOMENTUM,
             SGD_NESTEROV)

"""inplace_scan: the same values and gradients as lax.scan, fewer buffers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import dots_per_loop, rel_err
from forge_jax._src.inplace_scan import inplace_scan, saved_residual_avals


def _body(c, d, k):
  # A residual MLP layer; k (uint32) only selects a sign, so it is not
  # differentiable but matters.
  sign = jnp.where(k["flip"] % 2 == 1, -1.0, 1.0)
  return c + sign * jnp.tanh(c @ d["w"] + d["b"]) * d["scale"]


def _inputs(rng, n=5, width=6, dtype=jnp.float32):
  diff = {"w": jnp.asarray(rng.standard_normal((n, width, width)) / 3, dtype),
          "b": jnp.asarray(rng.standard_normal((n, width)), dtype),
          "scale": jnp.asarray(rng.random((n,)) + 0.5, dtype)}
  const = {"flip": jnp.asarray(rng.integers(0, 4, (n,)), jnp.uint32)}
  carry = jnp.asarray(rng.standard_normal((3, width)), dtype)
  return carry, diff, const


def _loss_scan(carry, diff, const):
  out = jax.lax.scan(lambda c, xs: (_body(c, *xs), None), carry, (diff, const))[0]
  return jnp.sum(out ** 2)


def _loss_inplace(carry, diff, const, remat=True):
  return jnp.sum(inplace_scan(_body, carry, diff, const, remat=remat) ** 2)


REMAT = pytest.mark.parametrize("remat", [True, False], ids=["remat", "saved"])


@REMAT
def test_values_and_gradients_equal_lax_scan(rng, remat):
  carry, diff, const = _inputs(rng)
  want = jax.value_and_grad(_loss_scan, argnums=(0, 1))(carry, diff, const)
  got = jax.jit(jax.value_and_grad(_loss_inplace, argnums=(0, 1)),
                static_argnums=3)(carry, diff, const, remat)
  assert rel_err(got[0], want[0]) <= 1e-6
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    assert rel_err(a, b) <= 1e-5


@REMAT
def test_one_layer_and_bf16(rng, remat):
  carry, diff, const = _inputs(rng, n=1, dtype=jnp.bfloat16)
  got = jax.grad(_loss_inplace, argnums=1)(carry, diff, const, remat)
  want = jax.grad(_loss_scan, argnums=1)(carry, diff, const)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == jnp.bfloat16
    assert rel_err(a.astype(jnp.float32), b.astype(jnp.float32)) <= 2e-2


def test_backward_holds_one_stack(rng):
  """With the stack donated, the compiled gradient needs no second stack.
  (remat=False: tests/test_llama.py checks the fused Llama step; with a plain
  gradient as here the backward's read of w for dc has no path to w's
  in-place write, and XLA copies the stack: inplace_scan's docstring.)"""
  n, width = 8, 256
  carry, diff, const = _inputs(rng, n=n, width=width)
  stack_bytes = sum(a.nbytes for a in jax.tree.leaves(diff))

  def temp(loss):
    f = jax.jit(jax.grad(loss, argnums=1), donate_argnums=(1,))
    return f.lower(carry, diff, const).compile().memory_analysis().temp_size_in_bytes

  t_scan, t_inplace = temp(_loss_scan), temp(_loss_inplace)
  assert t_scan >= 0.9 * stack_bytes          # lax.scan: a fresh stacked gradient
  # In place: a layer's slices and activations, not a second stack (CPU:
  # <= 0.25 of the stack; H200, jax 0.11.2: 0.27).
  assert t_inplace <= 0.4 * stack_bytes


@pytest.mark.parametrize("bad,match", [
    (lambda d, k: ({"w": d["w"].astype(jnp.int32)}, k), "must be floating"),
    (lambda d, k: (d, {"flip": k["flip"][:2]}), "same leading"),
    (lambda d, k: (d, {"flip": k["flip"], "x": d["b"]}), "no gradient"),
    (lambda d, k: (jax.tree.map(lambda a: a[:0], d),
                   jax.tree.map(lambda a: a[:0], k)), "0 layers"),
])
def test_bad_inputs(rng, bad, match):
  carry, diff, const = _inputs(rng)
  d, k = bad(diff, const)
  with pytest.raises(ValueError, match=match):
    inplace_scan(lambda c, d, k: c, carry, d, k)


@REMAT
def test_closed_over_values_get_their_gradient(rng, remat):
  """A scale shared by every layer, closed over by the body, under jax.grad."""
  carry, diff, const = _inputs(rng)

  def loss(a, scan):
    def body(c, d, k):
      return _body(c, d, k) * a
    if scan:
      out = jax.lax.scan(lambda c, xs: (body(c, *xs), None), carry, (diff, const))[0]
    else:
      out = inplace_scan(body, carry, diff, const, remat=remat)
    return jnp.sum(out ** 2)

  want = jax.grad(loss)(1.1, True)
  got = jax.jit(jax.grad(loss), static_argnums=1)(1.1, False)
  assert rel_err(got, want) <= 1e-5


def test_saved_residuals_spare_the_backward_its_forward(rng):
  """remat=False: the backward loop runs only the VJP's matmuls (dc and dw),
  not the forward's c @ w again, and nothing weight-sized is saved."""
  carry, diff, const = _inputs(rng, n=4, width=8)
  def dots(remat):
    grad = jax.grad(lambda c, d: _loss_inplace(c, d, const, remat), argnums=(0, 1))
    return dots_per_loop(jax.make_jaxpr(grad)(carry, diff))
  # The forward loop: c @ w. The backward loop: dc and dw, and with remat
  # c @ w again.
  assert dots(True) == [1, 3] and dots(False) == [1, 2], (dots(True), dots(False))
  avals = saved_residual_avals(_body, carry, diff, const)
  assert avals and all(a.shape == carry.shape for a in avals), avals


def test_weight_only_residuals_are_recomputed_not_saved(rng):
  """Residuals computed from the weights alone (sin(w), which c @ sin(w)'s
  VJP keeps, and cos(w), which sin's keeps) are recomputed from slice i, so
  the forward saves no (n, width, width) stack; the gradients stay exact."""
  carry, diff, const = _inputs(rng, n=3, width=8)

  def body(c, d, k):
    return c + jnp.tanh(c @ jnp.sin(d["w"]))

  avals = saved_residual_avals(body, carry, diff, const)
  assert all(a.shape != diff["w"].shape[1:] for a in avals), avals

  def loss(c, d, remat):
    return jnp.sum(inplace_scan(body, c, d, const, remat=remat) ** 2)
  want = jax.grad(lambda c, d: jnp.sum(jax.lax.scan(
      lambda c, x: (body(c, *x), None), c, (d, const))[0] ** 2), argnums=(0, 1))(carry, diff)
  got = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(carry, diff, False)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert rel_err(a, b) <= 1e-6


def test_remat_must_be_a_bool(rng):
  carry, diff, const = _inputs(rng)
  with pytest.raises(ValueError, match="remat must be a bool"):
    inplace_scan(_body, carry, diff, const, remat="no")


@REMAT
def test_a_side_effect_in_the_body(rng, remat):
  """A body with an effect (a debug callback of the carry) runs, with the
  gradients of lax.scan; without remat the backward does not run it again."""
  calls = []

  def body(c, d, k):
    jax.debug.callback(lambda s: calls.append(float(s)), c.sum())
    return _body(c, d, k)

  carry, diff, const = _inputs(rng, n=4)
  want = jax.grad(_loss_scan, argnums=(0, 1))(carry, diff, const)
  calls.clear()
  got = jax.jit(jax.grad(lambda c, d: jnp.sum(
      inplace_scan(body, c, d, const, remat=remat) ** 2), argnums=(0, 1)))(carry, diff)
  jax.effects_barrier()
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert rel_err(a, b) <= 1e-5
  # 4 layers forward; with remat their recomputation runs it again
  assert len(calls) == (8 if remat else 4), len(calls)

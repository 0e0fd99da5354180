"""Stochastic rounding fp32 -> bf16 (for bf16 weights updated in fp32)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import lower_for_cuda
from jax.experimental import pallas as pl

from pallas_kernels import precision


def test_exact_bf16_values_inf_and_nan_are_unchanged(rng):
  exact = jnp.asarray(rng.standard_normal(4096) * 10.0**rng.integers(-30, 30, 4096),
                      jnp.bfloat16).astype(jnp.float32)
  special = jnp.asarray([np.inf, -np.inf, np.nan, 0.0, -0.0], jnp.float32)
  x = jnp.concatenate([exact, special])
  y = precision.stochastic_round_array(x, seed=3, step=11)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(y[:-5], np.float32), np.asarray(exact))
  got = np.asarray(y[-5:], np.float32)
  assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
  assert got[3] == 0 and got[4] == 0 and np.signbit(got[4])


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("frac", [0.3, 0.77])
def test_unbiased_for_both_signs(sign, frac):
  ulp = 2.0**-7  # bf16 spacing in [1, 2)
  value = sign * (1.0 + 5 * ulp + frac * ulp)
  n = 20000
  x = jnp.full((n,), value, jnp.float32)
  y = np.asarray(precision.stochastic_round_array(x, seed=0, step=1), np.float64)
  lo, hi = sorted([sign * (1.0 + 5 * ulp), sign * (1.0 + 6 * ulp)])
  assert set(np.unique(y)) <= {lo, hi}
  sigma = ulp * np.sqrt(frac * (1 - frac) / n)
  assert abs(y.mean() - np.float32(value)) < 3 * sigma


def test_small_updates_accumulate_where_round_to_nearest_stalls():
  w_sr = jnp.ones((512,), jnp.bfloat16)
  w_rn = jnp.ones((512,), jnp.bfloat16)
  for step in range(1000):
    w_sr = precision.stochastic_round_array(w_sr.astype(jnp.float32) + 1e-4, 7, step)
    w_rn = (w_rn.astype(jnp.float32) + 1e-4).astype(jnp.bfloat16)
  assert np.all(np.asarray(w_rn, np.float32) == 1.0)
  assert abs(float(jnp.mean(w_sr.astype(jnp.float32))) - 1.1) < 0.01


def test_bits_depend_on_seed_step_and_index_only():
  idx = jnp.arange(1000, dtype=jnp.uint32)
  a = precision.random_bits(5, 9, idx)
  # Any tiling of the index space gives the same bits.
  np.testing.assert_array_equal(a[300:700], precision.random_bits(5, 9, idx[300:700]))
  assert not np.array_equal(a, precision.random_bits(6, 9, idx))
  assert not np.array_equal(a, precision.random_bits(5, 10, idx))
  # Roughly uniform low 16 bits.
  low = np.asarray(a) & 0xFFFF
  assert abs(low.mean() / 65536 - 0.5) < 0.05


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="x.dtype=bfloat16"):
    precision.stochastic_round_to_bf16(jnp.ones(3, jnp.bfloat16), jnp.ones(3, jnp.uint32))
  with pytest.raises(ValueError, match="bits must be uint32"):
    precision.stochastic_round_to_bf16(jnp.ones(3), jnp.ones(4, jnp.uint32))


def _sr_kernel(x_ref, hp_ref, o_ref, *, cols):
  from jax.experimental.pallas import triton as plgpu
  i = pl.program_id(0)
  rows = i * 16 + jnp.arange(16)
  c = jnp.arange(16)
  index = (rows[:, None] * cols + c[None, :]).astype(jnp.uint32)
  bits = precision.random_bits(hp_ref[0].astype(jnp.uint32),
                               hp_ref[1].astype(jnp.uint32), index)
  x = x_ref[pl.ds(i * 16, 16), :]
  plgpu.store(o_ref.at[pl.ds(i * 16, 16), :], precision.stochastic_round_to_bf16(x, bits))


def test_rounding_in_a_pallas_kernel_matches_and_lowers_to_triton(rng):
  from jax.experimental.pallas import triton as plgpu
  x = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
  hp = jnp.asarray([3.0, 17.0], jnp.float32)

  def call(x, hp, interpret):
    return pl.pallas_call(
        functools.partial(_sr_kernel, cols=16), grid=(4,),
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
        compiler_params=plgpu.CompilerParams(num_warps=4),
        interpret=interpret)(x, hp)

  got = call(x, hp, True)
  want = precision.stochastic_round_array(x, 3, 17)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  text = lower_for_cuda(
      jax.jit(lambda x, hp: call(x, hp, False)), x, hp).as_text()
  assert "__gpu$xla.gpu.triton" in text

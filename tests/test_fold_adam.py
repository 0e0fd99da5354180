"""FOAM's fold_adam as an optax transform (Wen et al., arXiv 2512.07112)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import rel_err
import forge_jax as fj
from forge_jax._src import fold as fold_lib
from pallas_kernels import quantization


def _params(rng, dtype=jnp.float32):
  return {"w": jnp.asarray(rng.standard_normal((6, 32)), dtype),
          "odd": jnp.asarray(rng.standard_normal((3, 2, 13)), dtype),
          "b": jnp.asarray(rng.standard_normal((32,)), dtype),
          "s": jnp.asarray(rng.standard_normal(()), dtype)}


def _grads(rng, params):
  return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype),
                      params)


def _run(tx, params, grads_list):
  state = tx.init(params)
  update = jax.jit(tx.update)
  for g in grads_list:
    u, state = update(g, state, params)
    params = optax.apply_updates(params, u)
  return params, state


def _numpy_foam(g_list, p, fold_level, lr, b1, b2, eps, wd, scale, nu_mode, residual):
  """FOAM written independently in numpy float64 on one (rows, n) matrix."""
  block = 2**fold_level
  p = np.asarray(p, np.float64)
  rows, n = p.shape
  nb = -(-n // block)
  mu = np.zeros((rows, nb))
  nu = np.zeros((rows, nb))
  for t, g in enumerate(g_list, start=1):
    g = np.asarray(g, np.float64)
    a = np.stack([g[:, j * block:(j + 1) * block].mean(-1) for j in range(nb)], -1)
    a2 = (np.stack([(g[:, j * block:(j + 1) * block] ** 2).mean(-1) for j in range(nb)], -1)
          if nu_mode == "mean_of_squares" else a * a)
    mu = b1 * mu + (1 - b1) * a
    nu = b2 * nu + (1 - b2) * a2
    e = lambda y: np.repeat(y, block, -1)[:, :n]  # noqa: E731
    r = g - e(a) if residual else 0.0
    m, v = e(mu) + r, e(nu) + r * r
    d = scale * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    p = p - lr * (d + wd * p)
  return p


@pytest.mark.parametrize("nu_mode", fold_lib.NU_MODES)
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("fold_level,n", [(2, 32), (3, 37), (4, 16), (4, 5), (1, 1)])
def test_matches_an_independent_numpy_foam(rng, fold_level, n, nu_mode, residual):
  p = jnp.asarray(rng.standard_normal((5, n)), jnp.float32)
  gs = [jnp.asarray(rng.standard_normal((5, n)), jnp.float32) for _ in range(4)]
  kw = dict(lr=1e-2, b1=0.9, b2=0.95, eps=1e-8, wd=0.1, scale=0.5)
  tx = fj.fold_adam(kw["lr"], fold_level, kw["b1"], kw["b2"], kw["eps"],
                    weight_decay=kw["wd"], scale=kw["scale"], nu_mode=nu_mode,
                    residual=residual)
  got, _ = _run(tx, {"w": p}, [{"w": g} for g in gs])
  want = _numpy_foam(gs, p, fold_level, nu_mode=nu_mode, residual=residual, **kw)
  assert rel_err(got["w"], want) < 1e-6


def test_fold_level_0_is_optax_adam_exactly(rng):
  params = _params(rng)
  gs = [_grads(rng, params) for _ in range(5)]
  got, _ = _run(fj.fold_adam(1e-2, fold_level=0, weight_decay=0.0), params, gs)
  want, _ = _run(optax.adam(1e-2), params, gs)
  for k in params:
    np.testing.assert_array_equal(got[k], want[k])
  got, _ = _run(fj.fold_adam(1e-2, fold_level=0, weight_decay=0.1), params, gs)
  want, _ = _run(optax.adamw(1e-2, weight_decay=0.1), params, gs)
  for k in params:
    np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("nu_mode", fold_lib.NU_MODES)
def test_blockwise_constant_gradient_is_adam(rng, nu_mode):
  """Residual zero: both readings of the second moment give Adam."""
  params = {"w": jnp.asarray(rng.standard_normal((4, 64)), jnp.float32)}
  gs = [{"w": jnp.repeat(jnp.asarray(rng.standard_normal((4, 8)), jnp.float32), 8, -1)}
        for _ in range(5)]
  got, state = _run(fj.fold_adam(1e-2, fold_level=3, nu_mode=nu_mode), params, gs)
  want, _ = _run(optax.adamw(1e-2), params, gs)
  assert rel_err(got["w"], want["w"]) < 1e-6
  assert state[0].mu["w"].shape == (4, 8)


def test_the_two_readings_of_nu_differ_on_general_gradients(rng):
  params = {"w": jnp.asarray(rng.standard_normal((4, 64)), jnp.float32)}
  gs = [_grads(rng, params) for _ in range(3)]
  a, sa = _run(fj.fold_adam(1e-2, 3, nu_mode="mean_of_squares"), params, gs)
  b, sb = _run(fj.fold_adam(1e-2, 3, nu_mode="square_of_mean"), params, gs)
  # By Jensen, the mean of squares is at least the square of the mean.
  assert bool(jnp.all(sa[0].nu["w"] >= sb[0].nu["w"] * (1 - 1e-6)))
  assert rel_err(a["w"], b["w"]) > 1e-4


def test_state_shapes_and_unfolded_leaves(rng):
  params = {**_params(rng), "empty": jnp.zeros((3, 0)), "vec0": jnp.zeros((0,))}
  state = fj.fold_adam(1e-3, fold_level=3).init(params)[0]
  assert state.mu["w"].shape == (6, 4)      # 32 / 8
  assert state.mu["odd"].shape == (3, 2, 2)  # ceil(13 / 8): a partial block
  assert state.mu["b"].shape == (32,)        # 1-D: plain Adam
  assert state.mu["s"].shape == ()
  assert state.mu["empty"].shape == (3, 0)
  assert state.nu["odd"].shape == (3, 2, 2)
  g = _grads(rng, params)
  u, _ = jax.jit(fj.fold_adam(1e-3, fold_level=3).update)(g, fj.fold_adam(
      1e-3, fold_level=3).init(params), params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(u))
  assert jax.tree.map(jnp.shape, u) == jax.tree.map(jnp.shape, params)


def test_one_d_and_scalar_leaves_get_plain_adam(rng):
  params = {"b": jnp.asarray(rng.standard_normal((7,)), jnp.float32),
            "s": jnp.asarray(1.5, jnp.float32)}
  gs = [_grads(rng, params) for _ in range(3)]
  got, _ = _run(fj.fold_adam(1e-2, fold_level=3, weight_decay=0.0), params, gs)
  want, _ = _run(optax.adam(1e-2), params, gs)
  for k in params:
    np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("level", [2, 3, 4])
def test_state_bytes_are_2_over_2_to_the_l_of_adams(level):
  params = {"w": jnp.zeros((64, 256)), "v": jnp.zeros((3, 128, 64))}
  adam = sum(x.nbytes for x in jax.tree.leaves(optax.adam(1e-3).init(params))
             if x.ndim > 0)
  fold = sum(x.nbytes for x in jax.tree.leaves(
      fj.scale_by_fold_adam(level).init(params)) if x.ndim > 0)
  assert fold * 2**level == adam


def test_int8_and_bf16_folded_states(rng):
  params = {"w": jnp.asarray(rng.standard_normal((8, 1024)), jnp.float32)}
  gs = [_grads(rng, params) for _ in range(5)]
  ref, _ = _run(fj.fold_adam(1e-2, 3), params, gs)
  for dtype, tol in [(jnp.bfloat16, 2e-3), (jnp.int8, 2e-2)]:
    got, state = _run(fj.fold_adam(1e-2, 3, mu_dtype=dtype, nu_dtype=dtype), params, gs)
    mu, nu = state[0].mu["w"], state[0].nu["w"]
    if dtype == jnp.int8:
      assert isinstance(mu, quantization.QuantizedArray) and nu.nonnegative
      assert mu.codes.shape == (8, 128) and mu.scale.shape == (8, 2)
    else:
      assert mu.dtype == jnp.bfloat16 and mu.shape == (8, 128)
    # The parameter change tracks the fp32-state run.
    assert rel_err(got["w"] - params["w"], ref["w"] - params["w"]) < tol
  bytes_int8 = sum(x.nbytes for x in jax.tree.leaves(
      fj.scale_by_fold_adam(3, mu_dtype=jnp.int8, nu_dtype=jnp.int8).init(params))
      if x.ndim > 0)
  assert bytes_int8 == 2 * (8 * 128 + 4 * 8 * 2)


def test_composes_with_clip_by_global_norm(rng):
  params = _params(rng)
  gs = [jax.tree.map(lambda x: 10 * x, _grads(rng, params)) for _ in range(3)]
  got, _ = _run(optax.chain(optax.clip_by_global_norm(1.0), fj.fold_adam(1e-2, 2)),
                params, gs)
  clip = optax.clip_by_global_norm(1.0)
  clipped = [clip.update(g, clip.init(params))[0] for g in gs]
  want, _ = _run(fj.fold_adam(1e-2, 2), params, clipped)
  for k in params:
    assert rel_err(got[k], want[k]) < 1e-6


def test_inject_hyperparams_keeps_them_fp32_with_bf16_params(rng):
  params = _params(rng, jnp.bfloat16)
  tx = optax.inject_hyperparams(fj.fold_adam, static_args=("fold_level",),
                                hyperparam_dtype=jnp.float32)(
      learning_rate=1e-3, fold_level=2, b2=0.999, weight_decay=0.01)
  state = tx.init(params)
  u, state = jax.jit(tx.update)(_grads(rng, params), state, params)
  assert state.hyperparams["b2"].dtype == jnp.float32
  assert float(state.hyperparams["b2"]) == np.float32(0.999)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(u))
  assert all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32))))
             for x in jax.tree.leaves(u))


def test_masked_including_nested_twice(rng):
  params = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal((16,)), jnp.float32)}
  gs = [_grads(rng, params) for _ in range(3)]
  inner = fj.fold_adam(1e-2, 2)
  got, _ = _run(optax.masked(inner, {"w": True, "b": False}), params, gs)
  want, _ = _run(inner, {"w": params["w"]}, [{"w": g["w"]} for g in gs])
  np.testing.assert_array_equal(got["w"], want["w"])
  # Masked-out leaves pass their gradient through unchanged (optax.masked).
  want_b = params["b"]
  for g in gs:
    want_b = want_b + g["b"]
  np.testing.assert_array_equal(got["b"], want_b)
  nested = {"outer": params, "other": {"w": params["w"]}}
  gsn = [{"outer": g, "other": {"w": g["w"]}} for g in gs]
  tx = optax.masked(optax.masked(inner, {"outer": {"w": True, "b": True},
                                         "other": {"w": False}}),
                    {"outer": {"w": True, "b": False}, "other": {"w": True}})
  got2, _ = _run(tx, nested, gsn)
  np.testing.assert_array_equal(got2["outer"]["w"], want["w"])


def test_multisteps_accumulates_then_steps_on_the_mean(rng):
  params = _params(rng)
  gs = [_grads(rng, params) for _ in range(4)]
  tx = optax.MultiSteps(fj.fold_adam(1e-2, 2), every_k_schedule=4)
  state = tx.init(params)
  inner0 = state.inner_opt_state
  update = jax.jit(tx.update)
  for i, g in enumerate(gs[:3]):
    u, state = update(g, state, params)
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u))
    for a, b in zip(jax.tree.leaves(state.inner_opt_state), jax.tree.leaves(inner0)):
      np.testing.assert_array_equal(a, b)
  u, state = update(gs[3], state, params)
  mean = jax.tree.map(lambda *x: sum(x) / 4, *gs)
  inner = fj.fold_adam(1e-2, 2)
  want, _ = inner.update(mean, inner.init(params), params)
  for k in params:
    assert rel_err(u[k], want[k]) < 1e-6


def test_jit_keeps_the_param_dtype(rng):
  params = _params(rng, jnp.bfloat16)
  tx = fj.fold_adam(1e-3, 3)
  u, _ = jax.jit(tx.update)(_grads(rng, params), tx.init(params), params)
  assert jax.tree.map(lambda x: x.dtype, u) == jax.tree.map(lambda x: x.dtype, params)


def test_sharded_like_fsdp_matches_one_device(rng, on_cpu):
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices("cpu")[:2],
                       axis_types=(jax.sharding.AxisType.Auto,))
  params = {"w": jnp.asarray(rng.standard_normal((8, 64)), jnp.float32)}
  gs = [_grads(rng, params) for _ in range(3)]
  tx = fj.fold_adam(1e-2, 3)
  want, _ = _run(tx, params, gs)
  sharding = NamedSharding(mesh, P(None, "fsdp"))
  p = jax.device_put(params, sharding)
  state = jax.jit(tx.init, out_shardings=None)(p)
  update = jax.jit(tx.update)
  for g in gs:
    u, state = update(jax.device_put(g, sharding), state, p)
    p = optax.apply_updates(p, u)
  assert rel_err(p["w"], want["w"]) < 1e-6
  for moment in (state[0].mu["w"], state[0].nu["w"]):
    assert moment.shape == (8, 8)
    assert moment.sharding.is_equivalent_to(sharding, moment.ndim), moment.sharding


def test_labels_of_flax_attention_and_layer_norm():
  import flax.linen as nn

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.LayerNorm()(x + nn.MultiHeadDotProductAttention(num_heads=4)(x))
      return nn.Dense(64)(nn.Embed(10, 64)(jnp.zeros((2,), jnp.int32))[0] + x)

  params = Block().init(jax.random.key(0), jnp.ones((2, 8, 64)))["params"]
  labels = fj.fold_adam_labels(params)
  attn = labels["MultiHeadDotProductAttention_0"]
  assert {attn[k]["kernel"] for k in ("query", "key", "value", "out")} == {"fold"}
  assert labels["Dense_0"]["kernel"] == "fold"
  assert labels["Embed_0"]["embedding"] == "adam"
  assert set(jax.tree.leaves(labels["LayerNorm_0"])) == {"adam"}


def test_numpy_integer_fold_level_is_accepted():
  tx = fj.fold_adam(1e-3, fold_level=np.int64(3))
  assert tx.init({"w": jnp.zeros((2, 64))})[0].mu["w"].shape == (2, 8)


def test_hybrid_labels_follow_the_paper():
  params = {"embed": {"embedding": jnp.zeros((50, 8))},
            "layers_0": {"attn": {"q_proj": {"kernel": jnp.zeros((8, 8))}},
                         "mlp": {"up_proj": {"kernel": jnp.zeros((8, 32)),
                                             "bias": jnp.zeros((32,))}},
                         "attn_norm": {"scale": jnp.zeros((8,))}},
            "lm_head": {"kernel": jnp.zeros((8, 50))}}
  labels = fj.fold_adam_labels(params)
  assert labels["embed"]["embedding"] == "adam"
  assert labels["lm_head"]["kernel"] == "adam"
  assert labels["layers_0"]["attn"]["q_proj"]["kernel"] == "fold"
  assert labels["layers_0"]["mlp"]["up_proj"]["kernel"] == "fold"
  assert labels["layers_0"]["mlp"]["up_proj"]["bias"] == "adam"
  assert labels["layers_0"]["attn_norm"]["scale"] == "adam"
  tx = fj.hybrid_fold_adam(1e-2, fold_level=2, scale=0.25)
  state = tx.init(params)
  g = jax.tree.map(jnp.ones_like, params)
  u, _ = jax.jit(tx.update)(g, state, params)
  # The folded group is scaled by α = 0.25: Adam's first step is -lr·sign(g).
  np.testing.assert_allclose(u["layers_0"]["attn"]["q_proj"]["kernel"], -0.25e-2, rtol=1e-5)
  np.testing.assert_allclose(u["lm_head"]["kernel"], -1e-2, rtol=1e-5)


def test_hybrid_adam_group_moment_dtype():
  """adam_moment_dtype stores the AdamW group's moments so (int8: a quarter
  and a bit of fp32) and, in fp32, computes optax.adamw's updates."""
  k = jax.random.split(jax.random.key(11), 3)
  params = {"embed": {"embedding": jax.random.normal(k[0], (50, 64))},
            "layers_0": {"mlp": {"up_proj": {"kernel": jax.random.normal(k[1], (64, 32))}}}}
  grads = [jax.tree.map(lambda p, i=i: jax.random.normal(jax.random.fold_in(k[2], i),
                                                         p.shape), params)
           for i in range(3)]

  def run(**kw):
    tx = fj.hybrid_fold_adam(1e-2, fold_level=2, weight_decay=0.1, **kw)
    state, us = tx.init(params), []
    for g in grads:
      u, state = jax.jit(tx.update)(g, state, params)
      us.append(u)
    return us, state

  (u_ref, s_ref), (u32, s32), (_, s8) = (
      run(), run(adam_moment_dtype=jnp.float32), run(adam_moment_dtype=jnp.int8))
  for a, b in zip(u_ref, u32):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      assert rel_err(y, x) <= 1e-6

  def embed_state_bytes(state):
    return sum(x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(state)
               if "embed" in jax.tree_util.keystr(path))
  assert embed_state_bytes(s32) == embed_state_bytes(s_ref) == 2 * 50 * 64 * 4
  assert embed_state_bytes(s8) == 2 * 50 * 64 * (1 + 4 / 64)


@pytest.mark.parametrize("kw,match", [
    (dict(fold_level=-1), "fold_level=-1 must be an int"),
    (dict(fold_level=2.0), "fold_level=2.0 must be an int"),
    (dict(b2=1.0), "b2=1.0 must be in"),
    (dict(nu_mode="rms"), "nu_mode='rms' must be one of"),
    (dict(mu_dtype=jnp.float16), "mu_dtype=.*must be one of"),
    (dict(weight_decay=-1.0), "weight_decay=-1.0 must be in"),
    (dict(fold_level=True), "fold_level=True must be an int"),
    (dict(b1="0.9"), "b1='0.9' must be a real number"),
    (dict(b2="0.99"), "b2='0.99' must be a real number"),
    (dict(scale=float("nan")), "scale=nan must be in"),
    (dict(scale=-0.5), "scale=-0.5 must be in"),
    (dict(scale="a"), "scale='a' must be a real number"),
    (dict(residual="no"), "residual='no' must be True or False"),
])
def test_bad_arguments_are_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    fj.fold_adam(1e-3, **kw)


def test_traced_fold_level_and_integer_params_are_refused():
  """inject_hyperparams without static_args traces fold_level: the error
  says so (not 'None'); an integer leaf is refused by init, where optax's
  adam would leave it at zero update."""
  params = {"w": jnp.ones((4, 8)), "ids": jnp.arange(3)}
  tx = optax.inject_hyperparams(fj.fold_adam)(learning_rate=1e-2, fold_level=2)
  w = {"w": params["w"]}
  with pytest.raises(ValueError, match=r"fold_level=<a traced value> .*static_args"):
    jax.jit(tx.update)(w, tx.init(w), w)
  with pytest.raises(ValueError, match="fold_adam: params must be real floating "
                     "point, got a int32 leaf"):
    fj.fold_adam(1e-2).init(params)
  state = optax.masked(fj.fold_adam(1e-2), {"w": True, "ids": False}).init(params)
  assert jax.tree.leaves(state)  # the float leaf alone is fine
  # numpy's bool is a bool here, as Python's.
  g = {"w": jnp.full((4, 8), 0.5)}
  for residual in (True, False):
    a = fj.fold_adam(1e-2, residual=np.bool_(residual))
    b = fj.fold_adam(1e-2, residual=residual)
    ua, _ = a.update(g, a.init(w), w)
    ub, _ = b.update(g, b.init(w), w)
    np.testing.assert_array_equal(ua["w"], ub["w"])

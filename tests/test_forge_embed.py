"""ForgeEmbed and the fused embedding update against their unfused references."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import bench_embed_update
import forge_jax as fj
from forge_jax._src import embed as embed_lib
from forge_jax.models.llama import Llama, LlamaConfig, cross_entropy_loss
from pallas_kernels import quantization

TINY = LlamaConfig(vocab_size=61, d_model=32, n_layers=1, n_heads=4,
                   n_kv_heads=2, ffn_dim=48, max_seq_len=32)

OPTIMIZERS = {
    "adamw": lambda **kw: fj.adamw(3e-2, weight_decay=0.1, **kw),
    "lion": lambda **kw: fj.lion(1e-2, weight_decay=0.1, **kw),
    "momentum": lambda **kw: fj.sgd(1e-1, momentum=0.9, **kw),
    "adagrad": lambda **kw: fj.adagrad(1e-1, **kw),
}


def _random_state(opt, shape, rng):
  """The optimizer's state for ``shape`` filled with fresh random values
  (non-negative where the rule needs it), stored as the optimizer stores it."""
  init = opt.init_state(shape)
  out = []
  for name in opt.rule.state_names:
    x = rng.standard_normal(shape).astype(np.float32)
    if name in opt.rule.nonnegative_states:
      x = np.abs(x) * 1e-2
    out.append(quantization.state_from_f32(jnp.asarray(x), init[name]))
  return tuple(out)


def _f32(x):
  return np.asarray(quantization.state_to_f32(x))


SHAPES = [(37, 130, 23, None), (37, 130, 23, 6)]  # (V, D, N, slab_rows):
# 37 = 6 · 6 + 1, a last slab of one row
ODD_SHAPES = [(5, 1, 9, "auto"), (1, 64, 3, None), (200, 70, 1, 64)]


@pytest.mark.parametrize("name,v,d,n,slab_rows",
                         [(o, *SHAPES[1]) for o in sorted(OPTIMIZERS)]
                         + [("adamw", *s) for s in SHAPES[:1] + ODD_SHAPES])
@pytest.mark.parametrize("param_dtype,state_dtype", [
    (jnp.float32, jnp.float32), (jnp.bfloat16, jnp.bfloat16),
    (jnp.float32, jnp.int8), (jnp.bfloat16, jnp.int8)])
def test_fused_embed_update_equals_one_hot_reference(name, param_dtype,
                                                     state_dtype, v, d, n,
                                                     slab_rows):
  """The update from the lookup's cotangent, its states in one pass or in
  slabs of rows (a shorter last slab included), equals the rule applied to
  the dense one-hot weight gradient onehot(ids)ᵀ·dY: rows seen (repeated
  ids, negative ids, out-of-range ids included) and rows not seen alike."""
  rng = np.random.default_rng([v, d, n])
  names = {"adamw": ("mu_dtype", "nu_dtype"), "lion": ("mu_dtype",),
           "momentum": ("accumulator_dtype",),
           "adagrad": ("sum_of_squares_dtype",)}[name]
  opt = OPTIMIZERS[name](**{k: state_dtype for k in names})
  table = jnp.asarray(rng.standard_normal((v, d)), param_dtype)
  state = _random_state(opt, (v, d), rng)
  ids = rng.integers(-v - 2, v + 2, n)
  ids[0] = rng.integers(0, v)  # at least one row seen
  ids = jnp.asarray(ids, jnp.int32)
  dy = jnp.asarray(rng.standard_normal((n, d)), jnp.bfloat16)
  hparams = opt.packed_hyperparams(jnp.int32(4))
  seed = jnp.uint32(2**31 + 7) if param_dtype == jnp.bfloat16 else None
  fused = jax.jit(functools.partial(embed_lib.fused_embed_update,
                                    rule=opt.rule, seed=seed,
                                    slab_rows=slab_rows))
  new_w, new_state = fused(ids, dy, table, state, hparams)
  ref_w, ref_state = embed_lib.fused_embed_update_reference(
      ids, dy, table, state, hparams, rule=opt.rule, seed=seed)
  assert new_w.dtype == table.dtype and new_w.shape == table.shape
  assert not np.array_equal(_f32(new_w), _f32(table))  # it moved
  tol = dict(rtol=2e-6, atol=2e-7) if param_dtype == jnp.float32 else dict(
      rtol=2**-7, atol=1e-6)  # one bf16 ulp: a 1-ulp fp32 difference may flip SR
  np.testing.assert_allclose(_f32(new_w), _f32(ref_w), **tol)
  for a, b, s in zip(new_state, ref_state, state):
    assert type(a) is type(s)
    assert quantization.state_storage_dtype(a) == quantization.state_storage_dtype(s)
    a, b = _f32(a), _f32(b)
    if state_dtype == jnp.float32:
      np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)
      continue
    # Stored rounded: a 1-ulp fp32 difference (the order of the sums of
    # repeated ids) may land on the other side of a rounding boundary, so
    # bf16 elements agree exactly but for a few, by one step of the storage
    # (int8: a block's scale may move by an ulp, and all its values with it).
    assert state_dtype == jnp.int8 or np.mean(a == b) > 0.9
    step = 2**-7 * np.abs(b) if state_dtype == jnp.bfloat16 else (
        np.max(np.abs(b)) / 100)
    assert np.all(np.abs(a - b) <= step + 1e-12)


@pytest.mark.parametrize("id_dtype", [jnp.int8, jnp.uint8, jnp.int16,
                                      jnp.int32, jnp.uint32])
def test_ids_of_every_integer_dtype_follow_jnp_take(id_dtype):
  """The rows updated are those jnp.take reads, whatever the ids' dtype:
  negative ids from the end, ids outside [-V, V) (the dtype's extremes
  included) nowhere; checked against jax.grad of jnp.take itself."""
  v, d = 100, 8
  info = jnp.iinfo(id_dtype)
  vals = [0, 1, 99, 100, 120, 3, 3, info.max, info.min, -1, -5, -100, -101]
  ids = jnp.asarray([x for x in vals if info.min <= x <= info.max], id_dtype)
  rng = np.random.default_rng(11)
  dy = jnp.asarray(rng.standard_normal((ids.shape[0], d)), jnp.float32)
  table = jnp.asarray(rng.standard_normal((v, d)), jnp.float32)
  opt = fj.sgd(1.0)
  hparams = opt.packed_hyperparams(jnp.int32(0))
  new_w, _ = embed_lib.fused_embed_update(ids, dy, table, (), hparams,
                                          rule=opt.rule)
  grad = jax.grad(lambda t: jnp.sum(jnp.take(t, ids, axis=0) * dy))(table)
  np.testing.assert_allclose(new_w, table - grad, rtol=1e-6, atol=1e-6)


def _large_int8_case(monkeypatch, v, d, *, seed, count, n=64):
  """A bf16 (v, d) table with random int8 AdamW moments, n random ids and a
  bf16 dy, and the hyperparameters at step ``count``; slabs of 256 rows
  (``transforms.CHUNK_ELEMENTS`` patched)."""
  from forge_jax._src import transforms
  monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", 256 * d)
  opt = fj.adamw(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  rng = np.random.default_rng(seed)
  table = jnp.asarray(rng.standard_normal((v, d)), jnp.bfloat16)
  state = _random_state(opt, (v, d), rng)
  ids = jnp.asarray(rng.integers(0, v, n), jnp.int32)
  dy = jnp.asarray(rng.standard_normal((n, d)), jnp.bfloat16)
  return opt, ids, dy, table, state, opt.packed_hyperparams(jnp.int32(count))


def test_fused_embed_update_needs_less_temp_than_the_dense_gradient(monkeypatch):
  """Compiled with the table and state donated, the default update of a
  large table with int8 states (its states in slabs) needs less temp than
  the unfused update of the dense (V, D) gradient (XLA's CPU compiler, jax
  0.10 and 0.11; the H200 is measured by experiments/bench_embed_update)."""
  v, d = 8192, 256
  opt, ids, dy, table, state, hparams = _large_int8_case(monkeypatch, v, d, seed=0,
                                                         count=0)
  assert embed_lib.default_slab_rows((v, d), state) == 256
  fused = functools.partial(embed_lib.fused_embed_update, hparams=hparams,
                            rule=opt.rule)
  unfused = functools.partial(bench_embed_update.dense_gradient_update,
                              hparams=hparams, rule=opt.rule)

  def temp(f):
    c = jax.jit(f, donate_argnums=(2, 3)).lower(ids, dy, table, state).compile()
    return c.memory_analysis().temp_size_in_bytes

  a, b = temp(fused), temp(unfused)
  assert b >= v * d * 2  # the unfused update holds (at least) the gradient
  assert a < 0.6 * b, (a, b)


@pytest.mark.parametrize("tail", [0, 100], ids=["whole_slabs", "tail_slab"])
def test_fused_embed_update_does_not_copy_its_states(monkeypatch, tail):
  """With the table and int8 states donated, the slabs write the states in
  place: the compiled update holds no copy of a moment's codes (before the
  fix, XLA's copy insertion copied both, as in the H200's 8B step: the
  table's pass read what the slab loop overwrote, unordered), so its temp
  stays below one moment's codes (XLA's CPU compiler, jax 0.10 and 0.11)."""
  v, d = 8192 + tail, 256
  opt, ids, dy, table, state, hparams = _large_int8_case(monkeypatch, v, d, seed=21,
                                                         count=3)
  f = functools.partial(embed_lib.fused_embed_update, hparams=hparams,
                        rule=opt.rule)
  compiled = jax.jit(f, donate_argnums=(2, 3)).lower(ids, dy, table, state).compile()
  codes = f"s8[{v},{d}]"
  copies = [line for line in compiled.as_text().splitlines()
            if codes in line and " copy(" in line]
  assert not copies, copies
  assert compiled.memory_analysis().temp_size_in_bytes < v * d
  # and the donated update is still the one-pass update
  got = jax.jit(f, donate_argnums=(2, 3))(ids, dy, jnp.copy(table),
                                         jax.tree.map(jnp.copy, state))
  want = jax.jit(functools.partial(f, slab_rows=None))(ids, dy, table, state)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("moments", [jnp.int8, jnp.float32], ids=["int8", "fp32"])
def test_fused_embed_update_of_an_empty_row_slabs(moments):
  """A (V, 0) table with explicit slabs runs (the slab loop's ordering reads
  no element of an empty table) and gives one pass's shapes and dtypes."""
  opt = fj.adamw(1e-2, mu_dtype=moments, nu_dtype=moments)
  rng = np.random.default_rng(22)
  table = jnp.zeros((5, 0), jnp.float32)
  state = _random_state(opt, (5, 0), rng)
  ids = jnp.asarray([0, 3, 3], jnp.int32)
  dy = jnp.zeros((3, 0), jnp.float32)
  hparams = opt.packed_hyperparams(jnp.int32(1))
  a = embed_lib.fused_embed_update(ids, dy, table, state, hparams, rule=opt.rule,
                                   slab_rows=2)
  b = embed_lib.fused_embed_update(ids, dy, table, state, hparams, rule=opt.rule,
                                   slab_rows=None)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.shape == y.shape and x.dtype == y.dtype


@pytest.mark.parametrize("rule", fj.rules.ALL_RULES, ids=lambda r: r.name)
def test_rule_states_do_not_read_the_weights(rule):
  """fused_embed_update's slabs compute the new states without the table
  (it is already overwritten): true of every rule forge_jax ships."""
  rng = np.random.default_rng(9)
  shape = (3, 70)
  grad = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  state = tuple(jnp.abs(jnp.asarray(rng.standard_normal(shape), jnp.float32))
                for _ in rule.state_names)
  hp = {k: jnp.float32(0.1) for k in rule.packed_names}
  count = jnp.float32(3)
  _, a = rule.update_masked(grad, jnp.asarray(rng.standard_normal(shape),
                                              jnp.float32), state, hp, count)
  _, b = rule.update_masked(grad, jnp.zeros(shape), state, hp, count)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def test_forge_embed_outside_a_fused_step_is_flax_embed():
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 50, (2, 7)))
  kw = dict(num_embeddings=50, features=12, dtype=jnp.bfloat16,
            param_dtype=jnp.float32)
  forge = fj.ForgeEmbed(**kw, optimizer=fj.adamw(1e-3))
  v = forge.init(jax.random.key(3), tokens)
  p = nn.Embed(**kw).init(jax.random.key(3), tokens)["params"]
  np.testing.assert_array_equal(v["params"]["embedding"], p["embedding"])
  assert set(v["forge_state"]) == {"mu", "nu", "probe"}
  np.testing.assert_array_equal(
      forge.apply({"params": v["params"]}, tokens),
      nn.Embed(**kw).apply({"params": p}, tokens))
  q = jnp.asarray(np.random.default_rng(2).standard_normal((3, 12)), jnp.float32)
  np.testing.assert_array_equal(forge.apply({"params": v["params"]}, q,
                                            method="attend"),
                                nn.Embed(**kw).apply({"params": p}, q,
                                                     method="attend"))
  bf16 = fj.ForgeEmbed(**{**kw, "param_dtype": jnp.bfloat16},
                       optimizer=fj.adamw(1e-3)).init(jax.random.key(3), tokens)
  assert bf16["forge_state"]["rounding_seed"].dtype == jnp.uint32


def _run(model, variables, tx, batch, steps=3):
  state = fj.TrainState.create(apply_fn=model.apply, variables=variables, tx=tx)
  step = fj.make_train_step(lambda vv, b: cross_entropy_loss(
      model.apply(vv, b[0]), b[1]))
  for _ in range(steps):
    state, m = step(state, batch)
    assert bool(m["forge_backward_ok"])
  return state


def test_fused_embedding_in_a_model_equals_unfused_adamw():
  """Llama with ForgeEmbed (fp32): after 3 fused steps the table equals
  optax.adamw's on the dense gradient, rows not in the batch included."""
  rng = np.random.default_rng(4)
  tokens = jnp.asarray(rng.integers(0, 30, (2, 9)), jnp.int32)  # rows 30+ unseen
  batch = (tokens[:, :-1], tokens[:, 1:])
  embed = functools.partial(fj.ForgeEmbed, optimizer=fj.adamw(1e-2))
  fused = Llama(TINY, embed_cls=embed)
  v = fused.init(jax.random.key(0), tokens)
  assert fj.fused_kernel_paths(v["forge_state"]) == (("embed",),)
  copy = lambda t: jax.tree.map(jnp.copy, t)  # noqa: E731  (the step donates)
  a = _run(fused, copy(v), optax.adamw(1e-2), batch)
  b = _run(Llama(TINY), {"params": copy(v["params"])}, optax.adamw(1e-2), batch)
  e0 = v["params"]["embed"]["embedding"]
  ea, eb = a.params["embed"]["embedding"], b.params["embed"]["embedding"]
  # seen rows moved by their gradient, unseen ones by the weight decay alone
  assert not np.allclose(ea[:30], e0[:30])
  assert not np.array_equal(ea[30:], e0[30:])
  np.testing.assert_allclose(ea, eb, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a.forge_state["embed"]["mu"],
                             b.opt_state[0].mu["embed"]["embedding"],
                             rtol=1e-5, atol=1e-7)
  for k in ("norm", "layers_0"):  # the other params trained alike
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4,
                                                         atol=1e-5),
                 a.params[k], b.params[k])


def test_fused_embedding_with_fused_head_and_int8_moments_trains():
  """bf16 table with stochastic rounding and int8 moments, beside a fused
  head: the loss falls and every fused backward ran once."""
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (2, 13)), jnp.int32)
  batch = (tokens[:, :-1], tokens[:, 1:])
  cfg = TINY.__class__(**{**TINY.__dict__, "dtype": jnp.bfloat16,
                          "param_dtype": jnp.bfloat16})
  opt = fj.adamw(3e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  model = Llama(cfg, embed_cls=functools.partial(fj.ForgeEmbed, optimizer=opt),
                head_cls=functools.partial(fj.ForgeDense, optimizer=opt,
                                           implementation="xla"))
  v = model.init(jax.random.key(0), tokens)
  assert isinstance(v["forge_state"]["embed"]["mu"], quantization.QuantizedArray)
  state = fj.TrainState.create(apply_fn=model.apply, variables=v,
                               tx=optax.adamw(3e-2))
  step = fj.make_train_step(lambda vv, b: cross_entropy_loss(
      model.apply(vv, b[0]), b[1]))
  losses = []
  for _ in range(6):
    state, m = step(state, batch)
    assert bool(m["forge_backward_ok"])
    losses.append(float(m["loss"]))
  assert losses[-1] < losses[0] - 0.5, losses


def test_tied_fused_embedding_is_refused():
  cfg = TINY.__class__(**{**TINY.__dict__, "tie_embeddings": True})
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, 61, (1, 5)))
  model = Llama(cfg, embed_cls=functools.partial(fj.ForgeEmbed,
                                                 optimizer=fj.adamw(1e-2)))
  v = model.init(jax.random.key(0), tokens)
  state = fj.TrainState.create(apply_fn=model.apply, variables=v,
                               tx=optax.adamw(1e-2))
  step = fj.make_train_step(lambda vv, b: cross_entropy_loss(
      model.apply(vv, b[0]), b[1]))
  with pytest.raises(ValueError, match="attend"):
    step(state, (tokens[:, :-1], tokens[:, 1:]))


def test_bad_optimizers_are_refused():
  tokens = jnp.zeros((1, 3), jnp.int32)
  with pytest.raises(TypeError, match="ForgeEmbed.optimizer"):
    fj.ForgeEmbed(10, 4, optimizer=optax.adamw(1e-3)).init(jax.random.key(0),
                                                           tokens)
  with pytest.raises(ValueError, match="not elementwise"):
    fj.ForgeEmbed(10, 64, optimizer=fj.fold_adam(1e-3, fold_level=2)).init(
        jax.random.key(0), tokens)
  opt = fj.adamw(1e-3)
  with pytest.raises(ValueError, match="slab_rows"):
    embed_lib.fused_embed_update(jnp.zeros((3,), jnp.int32), jnp.ones((3, 4)),
                                 jnp.ones((10, 4)),
                                 tuple(opt.init_state((10, 4)).values()),
                                 opt.packed_hyperparams(jnp.int32(0)),
                                 rule=opt.rule, slab_rows=0)
  with pytest.raises(ValueError, match="must be"):
    embed_lib.fused_embed_update(jnp.zeros((3,), jnp.int32),
                                 jnp.ones((3, 5)), jnp.ones((10, 4)),
                                 tuple(opt.init_state((10, 4)).values()),
                                 opt.packed_hyperparams(jnp.int32(0)),
                                 rule=opt.rule)


def test_stochastic_rounding_draws_the_reference_bits():
  """A bf16 table's stochastic rounding uses the bits of (seed, count,
  row · D + column), as ForgeDense and the reference: exactly the
  reference's result, and another seed or step gives other bits. SGD and
  unique ids make the fp32 values exact, so any difference is the rounding."""
  v, d = 300, 70
  rng = np.random.default_rng(12)
  table = jnp.asarray(rng.standard_normal((v, d)), jnp.bfloat16)
  ids = jnp.asarray(rng.permutation(v)[:40], jnp.int32)
  dy = jnp.asarray(rng.standard_normal((40, d)) * 1e-3, jnp.float32)
  rule = fj.sgd(1.0).rule

  def bits(fn, seed, step):
    hparams = fj.sgd(1.0).packed_hyperparams(jnp.int32(step))
    w, _ = fn(ids, dy, table, (), hparams, rule=rule, seed=seed)
    return np.asarray(jax.lax.bitcast_convert_type(w, jnp.uint16))[ids]

  fused = bits(embed_lib.fused_embed_update, jnp.uint32(7), 3)  # rows seen
  np.testing.assert_array_equal(
      fused, bits(embed_lib.fused_embed_update_reference, jnp.uint32(7), 3))
  for other in (bits(embed_lib.fused_embed_update, jnp.uint32(8), 3),
                bits(embed_lib.fused_embed_update, jnp.uint32(7), 4),
                bits(embed_lib.fused_embed_update, None, 3)):
    assert np.mean(fused != other) > 0.05


def test_fused_step_rounds_with_the_run_seed_unless_told_not_to():
  """In a fused step: TrainState.seed changes a bf16 table's rounding,
  stochastic_rounding=False rounds to nearest (the same for every seed)."""
  ids = jnp.asarray(np.random.default_rng(13).integers(0, 50, (2, 9)))

  def table_after_one_step(seed, stochastic_rounding=True):
    embed = fj.ForgeEmbed(50, 16, param_dtype=jnp.bfloat16,
                          optimizer=fj.sgd(0.3),
                          stochastic_rounding=stochastic_rounding)
    state = fj.TrainState.create(
        apply_fn=embed.apply, variables=embed.init(jax.random.key(0), ids),
        tx=optax.sgd(0.3), seed=seed)
    state, _ = fj.make_train_step(lambda vv, b: jnp.sum(
        jnp.sin(embed.apply(vv, b).astype(jnp.float32))))(state, ids)
    return np.asarray(state.params["embedding"], np.float32)

  a, b = table_after_one_step(0), table_after_one_step(1)
  assert np.mean(a != b) > 0.01
  nearest = table_after_one_step(0, False)
  np.testing.assert_array_equal(nearest, table_after_one_step(1, False))
  assert not np.array_equal(nearest, a)


def test_one_row_table_reads_that_row_for_every_id():
  """flax Embed with num_embeddings=1 broadcasts its row to every id, and
  so does a fused ForgeEmbed: the gradient of every lookup reaches it."""
  ids = jnp.asarray([[0, 1, 2]])
  kw = dict(num_embeddings=1, features=4)
  fused = fj.ForgeEmbed(**kw, optimizer=fj.sgd(0.5))
  v = fused.init(jax.random.key(0), ids)

  def loss(vv, b):
    return jnp.sum(fused.apply(vv, b) ** 2)

  state = fj.TrainState.create(apply_fn=fused.apply,
                               variables=jax.tree.map(jnp.copy, v),
                               tx=optax.sgd(0.5))
  new, m = fj.make_train_step(loss)(state, ids)
  grad = jax.grad(lambda p: jnp.sum(nn.Embed(**kw).apply({"params": p}, ids)
                                    ** 2))(v["params"])
  np.testing.assert_allclose(new.params["embedding"],
                             v["params"]["embedding"] - 0.5 * grad["embedding"],
                             rtol=1e-6)
  assert np.isfinite(float(m["loss"]))


def test_fused_lookup_has_the_embed_dtype():
  """dtype= sets the lookup's dtype in a fused step, as in flax Embed."""
  seen = []

  class Model(nn.Module):
    @nn.compact
    def __call__(self, ids):
      x = fj.ForgeEmbed(7, 4, dtype=jnp.bfloat16, param_dtype=jnp.float32,
                        optimizer=fj.adamw(1e-2), name="embed")(ids)
      seen.append(x.dtype)
      return x

  ids = jnp.asarray([[1, 2, 3]])
  model = Model()
  state = fj.TrainState.create(apply_fn=model.apply,
                               variables=model.init(jax.random.key(0), ids),
                               tx=optax.adamw(1e-2))
  fj.make_train_step(lambda vv, b: jnp.sum(
      model.apply(vv, b).astype(jnp.float32)))(state, ids)
  assert seen and all(d == jnp.bfloat16 for d in seen), seen


def test_fused_embedding_refusals():
  """Data parallelism (a shared table under vmap, a mesh axis of size > 1)
  and a state stored in another dtype are refused, naming ForgeEmbed."""
  ids = jnp.asarray([[1, 2, 3], [4, 5, 6]])
  embed = fj.ForgeEmbed(8, 4, optimizer=fj.adamw(1e-2))
  v = embed.init(jax.random.key(0), ids)

  def run(loss, variables=v, tx=optax.adamw(1e-2)):
    state = fj.TrainState.create(apply_fn=embed.apply,
                                 variables=jax.tree.map(jnp.copy, variables),
                                 tx=tx)
    return fj.make_train_step(loss)(state, ids)

  with pytest.raises(ValueError, match="ForgeEmbed at .*vmap"):
    run(lambda vv, b: jnp.sum(jax.vmap(lambda r: embed.apply(vv, r))(b)))
  if len(jax.devices()) >= 2:  # tests/conftest.py: two host CPUs
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
      with pytest.raises(ValueError, match=r"ForgeEmbed at .*\['data'\]"):
        run(lambda vv, b: jnp.sum(embed.apply(vv, b)))
  bf16 = fj.ForgeEmbed(8, 4, optimizer=fj.adamw(1e-2, mu_dtype=jnp.bfloat16))
  with pytest.raises(ValueError, match="ForgeEmbed at .* stored as float32"):
    run(lambda vv, b: jnp.sum(bf16.apply(vv, b)))


def test_a_layer_with_both_fused_params_is_refused():
  from forge_jax._src import train_state
  flat = {("a", "kernel"): 1, ("a", "embedding"): 2, ("b", "kernel"): 3}
  assert train_state.fused_param_keys(flat, [("b",)]) == (("b", "kernel"),)
  with pytest.raises(ValueError, match="more than one fused param"):
    train_state.fused_param_keys(flat, [("a",)])
  with pytest.raises(ValueError, match="no fused param"):
    train_state.fused_param_keys(flat, [("c",)])


def test_default_slabs(monkeypatch):
  """'auto' slabs: int8 states of tables of at least twice CHUNK_ELEMENTS
  elements, CHUNK_ELEMENTS per slab; none for float states or small tables."""
  from forge_jax._src import transforms
  monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", 1 << 12)
  int8 = fj.adamw(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  bf16 = fj.adamw(1e-3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
  states = lambda opt, shape: tuple(opt.init_state(shape).values())  # noqa: E731
  assert embed_lib.default_slab_rows((1024, 64), states(int8, (1024, 64))) == 64
  assert embed_lib.default_slab_rows((1024, 64), states(bf16, (1024, 64))) is None
  assert embed_lib.default_slab_rows((100, 64), states(int8, (100, 64))) is None
  monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", None)
  assert embed_lib.default_slab_rows((1024, 64), states(int8, (1024, 64))) is None
  # and the slabs run: 'auto' equals one pass
  monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", 1 << 10)  # 16 rows
  rng = np.random.default_rng(14)
  table = jnp.asarray(rng.standard_normal((200, 64)), jnp.float32)
  state = _random_state(int8, (200, 64), rng)
  assert embed_lib.default_slab_rows((200, 64), state) == 16
  ids = jnp.asarray(rng.integers(0, 200, 50), jnp.int32)
  dy = jnp.asarray(rng.standard_normal((50, 64)), jnp.float32)
  hparams = int8.packed_hyperparams(jnp.int32(2))
  a = embed_lib.fused_embed_update(ids, dy, table, state, hparams,
                                   rule=int8.rule)
  b = embed_lib.fused_embed_update(ids, dy, table, state, hparams,
                                   rule=int8.rule, slab_rows=None)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)

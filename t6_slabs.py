from common import *
from forge_jax._src import transforms
import sys
rng = np.random.default_rng(3)
def check(tag, opt, V, D, N, slab_rows, param_dtype=jnp.float32, seed=None):
  table = jnp.asarray(rng.standard_normal((V, D)), param_dtype)
  init = opt.init_state((V, D))
  st = []
  for n in opt.rule.state_names:
    x = rng.standard_normal((V, D)).astype(np.float32)
    if n in opt.rule.nonnegative_states: x = np.abs(x) * 1e-2
    st.append(quantization.state_from_f32(jnp.asarray(x), init[n]))
  st = tuple(st)
  ids = jnp.asarray(rng.integers(0, V, N), jnp.int32)
  dy = jnp.asarray(rng.standard_normal((N, D)), jnp.float32)
  hp = opt.packed_hyperparams(jnp.int32(2))
  f = jax.jit(functools.partial(embed_lib.fused_embed_update, rule=opt.rule, slab_rows=slab_rows, seed=seed))
  a_w, a_s = f(ids, dy, table, st, hp)
  b_w, b_s = embed_lib.fused_embed_update_reference(ids, dy, table, st, hp, rule=opt.rule, seed=seed)
  f32 = lambda x: np.asarray(quantization.state_to_f32(x))
  errs = [np.max(np.abs(f32(x) - f32(y))) for x, y in zip(a_s, b_s)]
  scale = [np.max(np.abs(f32(y))) for y in b_s]
  werr = np.max(np.abs(f32(a_w) - f32(b_w)))
  codes_eq = [float(np.mean(np.asarray(x.codes) == np.asarray(y.codes))) if hasattr(x, "codes") else None for x, y in zip(a_s, b_s)]
  print(f"{tag}: w err {werr:.3g}; state err {[f'{e:.3g}/{s:.3g}' for e, s in zip(errs, scale)]} codes_eq={codes_eq}")
i8 = lambda: fj.adamw(1e-2, weight_decay=0.1, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
for V, D, N, sr in [(10, 64, 7, 3), (10, 70, 7, 3), (7, 128, 4, 1), (7, 128, 4, 6), (7, 128, 4, 7), (7, 128, 20, 100), (64, 64, 5, 3)]:
  check(f"int8 V={V} D={D} N={N} slab={sr}", i8(), V, D, N, sr)
# auto slabs
print("default_slab_rows before:", embed_lib.default_slab_rows((50, 64), tuple(i8().init_state((50,64)).values())))
transforms.CHUNK_ELEMENTS = 64 * 4
print("default_slab_rows after:", embed_lib.default_slab_rows((50, 64), tuple(i8().init_state((50,64)).values())))
for V, D in [(50, 64), (9, 64), (33, 130), (8, 64)]:
  print("  rows:", embed_lib.default_slab_rows((V, D), tuple(i8().init_state((V,D)).values())))
  check(f"auto int8 V={V} D={D}", i8(), V, D, 11, "auto")
  check(f"auto int8 bf16 SR V={V} D={D}", i8(), V, D, 11, "auto", jnp.bfloat16, jnp.uint32(123))
  check(f"auto lion int8 V={V} D={D}", fj.lion(1e-2, mu_dtype=jnp.int8), V, D, 11, "auto")
  check(f"auto sgdmom int8 V={V} D={D}", fj.sgd(1e-2, momentum=0.9, accumulator_dtype=jnp.int8), V, D, 11, "auto")
transforms.CHUNK_ELEMENTS = 1 << 24

"""One launch of the Mosaic kernel per variant, for ncu (-k regex:mosaic)."""
import sys
import jax, jax.numpy as jnp
from experiments.bench_fused_dw import _flat, _unflat, MODES, FOLD_RULES, HYPERPARAMS as HP
from forge_jax.rules import ADAMW
from pallas_kernels import quantization
from pallas_kernels.fused_dw import fused_dw_update
for spec in sys.argv[1].split(","):
  mode, rname, t, shape = spec.split(":")
  t = int(t); d_in, d_out = map(int, shape.split("x"))
  rule = ADAMW if rname == "adamw" else FOLD_RULES[rname]
  hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
  w_dtype, s_dtype, sr = MODES[mode]
  seed = jnp.uint32(1234) if sr else None
  key = jax.random.key(t)
  x = jax.random.normal(key, (t, d_in), jnp.bfloat16)
  dy = jax.random.normal(jax.random.fold_in(key, 1), (t, d_out), jnp.bfloat16)
  w = jax.random.normal(jax.random.fold_in(key, 9), (d_in, d_out), w_dtype)
  st = []
  for i, name in enumerate(rule.state_names):
    v = 1e-2 * jax.random.normal(jax.random.fold_in(key, 10 + i), rule.state_shape((d_in, d_out)))
    nn_ = name in rule.nonnegative_states
    v = v * v if nn_ else v
    st.append(quantization.quantize(v, nn_) if jnp.dtype(s_dtype) == jnp.int8 else v.astype(s_dtype))
  like = tuple(st)
  def step(x, dy, *flat):
    *flat, hp_ = flat
    w_, s_ = _unflat(flat, like)
    nw, ns = fused_dw_update(x, dy, w_, s_, hp_, rule=rule, seed=seed, implementation="mosaic")
    return tuple(_flat(nw, ns))
  flat = _flat(w, like)
  f = jax.jit(step, donate_argnums=tuple(range(2, 2 + len(flat))))
  jax.block_until_ready(f(x, dy, *flat, hp))
  print("ran", spec, flush=True)

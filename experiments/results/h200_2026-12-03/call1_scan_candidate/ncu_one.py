"""One launch of the Mosaic kernel per spec mode:t:inxout, for ncu / SASS dumps."""
import sys
import jax, jax.numpy as jnp
from experiments.bench_fused_dw import _flat, _unflat, MODES, HYPERPARAMS as HP
from forge_jax.rules import ADAMW, SGD
from pallas_kernels import quantization
from pallas_kernels.fused_dw import fused_dw_update
MODES = dict(MODES, **{"bf16-rn-bf16": (jnp.bfloat16, jnp.bfloat16, False),
                      "bf16-sr-none": (jnp.bfloat16, None, True)})
for spec in sys.argv[1].split(","):
  mode, t, shape = spec.split(":")
  t = int(t); d_in, d_out = map(int, shape.split("x"))
  w_dtype, s_dtype, sr = MODES[mode]
  rule = SGD if s_dtype is None else ADAMW
  hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
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
  out = f(x, dy, *flat, hp)
  jax.block_until_ready(out)
  out = out if len(sys.argv) > 2 else f(x, dy, *out, hp)
  jax.block_until_ready(out)
  print("ran", spec, flush=True)

"""Stop 38: does a fused update on CUDA stream 1 overlap with matmuls on the
main stream? One jitted program: K fused AdamW updates (bf16 W rounded
stochastically, bf16 moments, T=512, 4096x14336, W/m/v donated) and K
independent dx-like matmuls (512x14336 @ 14336x4096); timed with the updates
on the main stream and on stream 1, beside each half alone."""
import time, sys
import jax, jax.numpy as jnp, numpy as np
from pallas_kernels.fused_dw import fused_dw_update
from experiments.bench_fused_dw import RULES
from experiments.probe_mosaic import HP
from forge_jax._src import dense as dense_lib

import os
SMOKE = bool(os.environ.get("SMOKE"))
K = 4
T, DI, DO = (64, 128, 256) if SMOKE else (512, 4096, 14336)
IMPL = "xla" if SMOKE else "mosaic"
rule = RULES["adamw"]
hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
key = jax.random.key(0)
r = lambda i, s, d=jnp.bfloat16: jax.random.normal(jax.random.fold_in(key, i), s, d)
x, dy = r(1, (T, DI)), r(2, (T, DO))
ws = [r(10 + i, (DI, DO)) for i in range(K)]
ms = [(1e-2 * r(20 + i, (DI, DO), jnp.float32)).astype(jnp.bfloat16) for i in range(K)]
vs = [(m.astype(jnp.float32) ** 2).astype(jnp.bfloat16) for m in ms]
bs = [r(30 + i, (DO, DI)) for i in range(K)]
seed = jnp.uint32(5)

def upd(x, dy, w, m, v, hp, seed):
  return fused_dw_update(x, dy, w, (m, v), hp, rule=rule, implementation=IMPL, seed=seed)

def make(stream, do_upd=True, do_mm=True):
  def f(ws, ms, vs, x, dy, bs, hp, seed):
    outs, mm = [], []
    for i in range(K):
      if do_mm:
        mm.append(jnp.dot(dy, bs[i], preferred_element_type=jnp.float32).astype(jnp.bfloat16))
      if do_upd:
        g = upd if stream is None else dense_lib._on_stream(upd, stream)
        outs.append(g(x, dy, ws[i], ms[i], vs[i], hp, seed))
    return outs, mm
  return jax.jit(f, donate_argnums=(0, 1, 2) if do_upd else ())

def timeit(fn, reps=20):
  global ws, ms, vs
  outs, mm = fn(ws, ms, vs, x, dy, bs, hp, seed)
  jax.block_until_ready((outs, mm))
  if outs:
    ws = [o[0] for o in outs]; ms = [o[1][0] for o in outs]; vs = [o[1][1] for o in outs]
  else:
    pass
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    outs, mm = fn(ws, ms, vs, x, dy, bs, hp, seed)
    jax.block_until_ready((outs, mm))
    ts.append((time.perf_counter() - t0) * 1e3)
    if outs:
      ws = [o[0] for o in outs]; ms = [o[1][0] for o in outs]; vs = [o[1][1] for o in outs]
  return float(np.median(ts))

print(jax.__version__, jax.devices()[0].device_kind, flush=True)
rows = []
for name, fn in [("matmuls alone", make(None, do_upd=False)),
                 ("updates alone", make(None, do_mm=False)),
                 ("both, one stream", make(None)),
                 ("both, updates on stream 1", make(1)),
                 ("updates alone on stream 1", make(1, do_mm=False))]:
  try:
    if "stream 1" in name:
      txt = fn.lower(ws, ms, vs, x, dy, bs, hp, seed).compile().as_text()
      print(name, "call-start in HLO:", txt.count("call-start"), flush=True)
    rows.append((name, timeit(fn)))
  except Exception as e:
    rows.append((name, float("nan"))); print(name, "ERROR", type(e).__name__, str(e)[:600], flush=True)
  print(rows[-1], flush=True)
print(f"\nK={K} updates (T={T}, {DI}x{DO}, AdamW bf16 SR) and K matmuls ({T}x{DO} @ {DO}x{DI}); ms per call, median of 20")
print("| variant | ms |\n|---|---|")
for n, v in rows:
  print(f"| {n} | {v:.3f} |")

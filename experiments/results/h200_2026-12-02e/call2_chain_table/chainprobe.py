"""Chain vs call at one shape: per-op time and the compiled ENTRY of each chain (copies?)."""
import re, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from experiments.bench_fused_dw import chained, _time_chained, _time_stateful, _flat, _unflat
from forge_jax.rules import ADAMW
from pallas_kernels.fused_dw import fused_dw_update, fused_dw_update_reference, MosaicConfig
from pallas_kernels.fused_dw.reference import weight_grad_reference

t, d_in, d_out = map(int, sys.argv[1:4])
interpret = "--interpret" in sys.argv
reps = 30
key = jax.random.key(0)
sets = [(jax.random.normal(jax.random.fold_in(key, 2*i), (t, d_in), jnp.bfloat16),
         jax.random.normal(jax.random.fold_in(key, 2*i+1), (t, d_out), jnp.bfloat16)) for i in range(3)]
w = jax.random.normal(jax.random.fold_in(key, 9), (d_in, d_out), jnp.float32)
mu = 1e-2 * jax.random.normal(jax.random.fold_in(key, 10), (d_in, d_out))
nu = mu ** 2
like = (mu, nu)
hp = ADAMW.pack(dict(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01), 7)

def chained_state(step, chain):
  def run(sets, carry, rest):
    carry = tuple(carry)
    for i in range(chain):
      x, dy = sets[i % len(sets)]
      carry, rest_i = lax.optimization_barrier((carry, tuple(rest)))
      carry = tuple(step(x, dy, *carry, *rest_i))
    return carry
  return jax.jit(run, donate_argnums=1)

def make(impl):
  def step(x, dy, *args):
    w_, st = _unflat(args[:3], like)
    if impl == "xla":
      nw, ns = fused_dw_update_reference(x, dy, w_, st, args[3], rule=ADAMW)
    else:
      nw, ns = fused_dw_update(x, dy, w_, st, args[3], rule=ADAMW, implementation=impl,
                               in_place=True, interpret=interpret)
    return tuple(_flat(nw, ns))
  return step

def entry(jitted, *args):
  txt = jitted.lower(*args).compile().as_text()
  m = re.search(r"\nENTRY .*?\n}\n", txt, re.S)
  lines = m.group(0).splitlines() if m else []
  keep = [l.strip()[:230] for l in lines if re.search(r"copy|transpose|fusion|custom-call|barrier|dot|cublas|gemm", l)]
  return keep

def dw_chain(chain, barrier):
  def run(sets, carry, rest):
    outs, prev = [], ()
    for i in range(chain):
      x, dy = sets[i % len(sets)]
      if barrier == "all":
        x, dy, prev = lax.optimization_barrier((x, dy, prev))
      else:
        prev = lax.optimization_barrier(prev)
      prev = weight_grad_reference(x, dy)
      outs.append(prev)
    return tuple(outs)
  return jax.jit(run)

print(jax.__version__, jax.devices()[0].device_kind, f"T={t} {d_in}x{d_out}", flush=True)
res = {}
for barrier in ("all", "state"):
  f = dw_chain(3, barrier)
  res[f"dW chain3 barrier={barrier}"] = _time_chained(f, sets, (), (), reps, 3, 3, feed_back=False)
  print(f"== dW chain3 barrier={barrier}: {res[f'dW chain3 barrier={barrier}']*1e3:.3f} ms", flush=True)
  for l in entry(f, sets, (), ()): print("   ", l)
fdw = jax.jit(weight_grad_reference)
from experiments.bench_fused_dw import _time
res["dW call"] = _time(fdw, sets, reps)
print(f"== dW call: {res['dW call']*1e3:.3f} ms", flush=True)
for impl in ("xla", "mosaic"):
  step = make(impl)
  copy = lambda: tuple(jnp.copy(v) for v in _flat(w, like))
  for name, f in (("all", chained(step, 3)), ("state", chained_state(step, 3))):
    try:
      s = _time_chained(f, sets, copy(), (hp,), reps, 3, 3)
      res[f"{impl} chain3 barrier={name}"] = s
      print(f"== {impl} chain3 barrier={name}: {s*1e3:.3f} ms", flush=True)
      for l in entry(f, sets, copy(), (hp,)): print("   ", l)
    except Exception as e:
      print(f"== {impl} chain3 barrier={name}: ERROR {type(e).__name__} {str(e)[:300]}")
  single = jax.jit(step, donate_argnums=(2, 3, 4))
  s = _time_stateful(single, sets, list(copy()), [hp], reps)
  res[f"{impl} call"] = s
  print(f"== {impl} call: {s*1e3:.3f} ms", flush=True)
  for l in entry(single, *sets[0], *copy(), hp): print("   ", l)
print("## " + " | ".join(f"{k} {v*1e3:.3f}" for k, v in res.items()))

"""Which patterns around the in-place Mosaic fused_dw custom call give wrong results on the GPU
(XLA's dynamic-slice fusion and output_to_operand aliasing), and which guard fixes them.

usage: python dsfprobe.py [IMPL]   (IMPL default mosaic; compared against implementation='xla')
"""
import os, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
from pallas_kernels.fused_dw import fused_dw_update
from forge_jax._src.rules import ADAMW

IMPL = sys.argv[1] if len(sys.argv) > 1 else "mosaic"
L, T, DI, DO = 3, 512, 512, 1024
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((L, T, DI)), jnp.bfloat16)
dy = jnp.asarray(rng.standard_normal((L, T, DO)), jnp.bfloat16)
W = jnp.asarray(rng.standard_normal((L, DI, DO)), jnp.float32)
MU = jnp.asarray(0.1 * rng.standard_normal((L, DI, DO)), jnp.float32)
NU = jnp.asarray(0.1 * rng.random((L, DI, DO)), jnp.float32)
hp = ADAMW.pack(dict(learning_rate=1e-2, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1), 3)


def upd(impl, guard, xi, dyi, w, mu, nu):
  if guard in ("in", "both"):
    w, mu, nu = lax.optimization_barrier((w, mu, nu))
  kw = {} if os.environ.get("IN_PLACE") is None else {"in_place": os.environ["IN_PLACE"] == "1"}
  nw, (nm, nn) = fused_dw_update(xi, dyi, w, (mu, nu), hp, rule=ADAMW, implementation=impl, **kw)
  if guard in ("out", "both"):
    nw, nm, nn = lax.optimization_barrier((nw, nm, nn))
  return nw, nm, nn


def scan_ys(impl, guard, W, MU, NU):
  def body(c, xs):
    xi, dyi, w, mu, nu = xs
    return c, upd(impl, guard, xi, dyi, w, mu, nu)
  return lax.scan(body, 0, (x, dy, W, MU, NU))[1]


def take(a, i):
  return lax.dynamic_index_in_dim(a, i, 0, keepdims=False)


def put(a, v, i):
  return lax.dynamic_update_index_in_dim(a, v, i, 0)


def fori_inplace(impl, guard, W, MU, NU, barrier=None):
  def body(i, c):
    W, MU, NU, acc = c
    nw, nm, nn = upd(impl, guard, take(x, i), take(dy, i), take(W, i), take(MU, i), take(NU, i))
    side = jnp.sum(take(dy, i).astype(jnp.float32))
    if barrier == "through":   # the committed order_update: new kernel taken from the barrier's output
      side, nw = lax.optimization_barrier((side, nw))
    elif barrier == "side":    # the barrier orders, the new kernel goes straight to the update slice
      side, _ = lax.optimization_barrier((side, nw))
    return put(W, nw, i), put(MU, nm, i), put(NU, nn, i), acc + side
  W, MU, NU, _ = lax.fori_loop(0, L, body, (W, MU, NU, jnp.float32(0)))
  return W, MU, NU


def fori_other(impl, guard, W, MU, NU):
  def body(i, c):
    W, MU, NU, W2, M2, N2 = c
    nw, nm, nn = upd(impl, guard, take(x, i), take(dy, i), take(W, i), take(MU, i), take(NU, i))
    return W, MU, NU, put(W2, nw, i), put(M2, nm, i), put(N2, nn, i)
  z = jnp.zeros_like(W)
  out = lax.fori_loop(0, L, body, (W, MU, NU, z, jnp.zeros_like(MU), jnp.zeros_like(NU)))
  return out[3:]


patterns = {
    "scan_ys": scan_ys,
    "fori_inplace": fori_inplace,
    "fori_inplace_barrier_through": lambda *a: fori_inplace(*a, barrier="through"),
    "fori_inplace_barrier_side": lambda *a: fori_inplace(*a, barrier="side"),
    "fori_other": fori_other,
}
ref = {}
rows = []
for name, f in patterns.items():
  want = jax.jit(lambda W, MU, NU: f("xla", None, W, MU, NU))(W, MU, NU)
  for guard in (None, "in", "out", "both"):
    fn = jax.jit(lambda W, MU, NU: f(IMPL, guard, W, MU, NU), donate_argnums=(0, 1, 2))
    comp = fn.lower(W, MU, NU).compile()
    temp = comp.memory_analysis().temp_size_in_bytes / 2**20
    hlo = comp.as_text()
    dsf = hlo.count("kind=kCustom, calls=%dynamic-slice-fusion")
    got = comp(*jax.tree.map(jnp.copy, (W, MU, NU)))
    err = max(float(jnp.max(jnp.abs(g - w_)) / (jnp.max(jnp.abs(w_)) + 1e-30)) for g, w_ in zip(got, want))
    ts = []
    for _ in range(5):
      a = jax.tree.map(jnp.copy, (W, MU, NU)); jax.block_until_ready(a)
      t0 = time.perf_counter(); jax.block_until_ready(comp(*a)); ts.append(time.perf_counter() - t0)
    rows.append((name, str(guard), err, dsf, temp, 1e3 * float(np.median(ts))))
    print(f"ROW {name:30s} guard={str(guard):5s} max rel err {err:9.3g}  dsf fusions {dsf}  temp {temp:7.1f} MiB  {rows[-1][-1]:.3f} ms", flush=True)

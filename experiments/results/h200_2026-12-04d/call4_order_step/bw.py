"""Stop 39: what XLA's own elementwise passes reach on the H200 over one
4096x14336 bf16 W and its two bf16 moments (donated, in place)."""
import time, statistics
import jax, jax.numpy as jnp
n, m = 4096, 14336
k = jax.random.key(0)
mk = lambda i, s=1.0: (s * jax.random.normal(jax.random.fold_in(k, i), (n, m))).astype(jnp.bfloat16)

@jax.jit
def rw3(w, mu, nu):
  return ((w.astype(jnp.float32) * 1.0001).astype(w.dtype),
          (mu.astype(jnp.float32) * 0.9).astype(mu.dtype),
          (nu.astype(jnp.float32) * 0.999).astype(nu.dtype))

@jax.jit
def adamw(g, w, mu, nu):
  g, w32 = g.astype(jnp.float32), w.astype(jnp.float32)
  mu2 = 0.9 * mu.astype(jnp.float32) + 0.1 * g
  nu2 = 0.999 * nu.astype(jnp.float32) + 0.001 * g * g
  w2 = w32 - 1e-3 * (mu2 / 0.1 / (jnp.sqrt(nu2 / 0.001) + 1e-8) + 0.01 * w32)
  return w2.astype(w.dtype), mu2.astype(mu.dtype), nu2.astype(nu.dtype)

rw3d = jax.jit(rw3.__wrapped__, donate_argnums=(0, 1, 2))
adamwd = jax.jit(adamw.__wrapped__, donate_argnums=(1, 2, 3))
for name, fn, nbytes, extra in (("read+write W, mu, nu (12 B/elem)", rw3d, 12, ()),
                                ("AdamW update, bf16 grad in (14 B/elem)", adamwd, 14, (mk(9),))):
  st = (mk(1), mk(2, 1e-2), mk(3, 1e-4))
  ts = []
  for r in range(30):
    jax.block_until_ready(st)
    t0 = time.perf_counter()
    st = fn(*extra, *st)
    jax.block_until_ready(st)
    ts.append(time.perf_counter() - t0)
  t = statistics.median(ts[5:])
  print(f"{name}: {t*1e3:.3f} ms, {n*m*nbytes/t/1e12:.2f} TB/s (host-timed, one call each)", flush=True)

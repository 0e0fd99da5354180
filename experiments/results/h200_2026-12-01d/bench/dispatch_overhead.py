"""Per-op time of the fused op, k ops chained inside one jit vs one op per jit call."""
import sys, time
import jax, jax.numpy as jnp
from forge_jax.rules import ALL_RULES
from pallas_kernels.fused_dw import fused_dw_update, fused_dw_update_reference
rule = {r.name: r for r in ALL_RULES}["adamw"]
hp = rule.pack({"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.01, "eps_root": 0.0}, 7)
shapes = [(512, 4096, 1024), (2048, 4096, 4096), (512, 4096, 14336), (8192, 4096, 1024)]
for impl in ("xla", "triton", "mosaic"):
  for t, di, do in shapes:
    k0 = jax.random.key(0)
    x = jax.random.normal(k0, (t, di), jnp.bfloat16)
    dy = jax.random.normal(jax.random.fold_in(k0, 1), (t, do), jnp.bfloat16)
    res = []
    for k in (1, 8):
      def f(x, dy, w, mu, nu, k=k):
        st = (mu, nu)
        for _ in range(k):
          if impl == "xla":
            w, st = fused_dw_update_reference(x, dy, w, st, hp, rule=rule)
          else:
            w, st = fused_dw_update(x, dy, w, st, hp, rule=rule, implementation=impl)
        return (w, *st)
      fj = jax.jit(f, donate_argnums=(2, 3, 4))
      c = (jnp.ones((di, do), jnp.float32), jnp.zeros((di, do)), jnp.zeros((di, do)))
      c = fj(x, dy, *c); jax.block_until_ready(c)
      c = fj(x, dy, *c); jax.block_until_ready(c)
      reps = 20
      t0 = time.perf_counter()
      for _ in range(reps):
        c = fj(x, dy, *c)
      jax.block_until_ready(c)
      res.append((time.perf_counter() - t0) / reps / k * 1e3)
    print(f"{impl:7s} T={t:5d} {di}->{do}: per op ms, 1 per call {res[0]:.3f}, 8 chained in one jit {res[1]:.3f}", flush=True)

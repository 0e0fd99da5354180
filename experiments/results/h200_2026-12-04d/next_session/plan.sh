# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. Stop 39 found the T=512 kernel's distance to its floor in the epilogue itself (T=64:
#    1.33-1.49x the byte floor; ~52 SASS instructions per weight; warps waiting on TMA
#    barriers; 16-byte spill; ncu: 361 MB sent to the L2 compression unit, 0% compressed).
#    Leads, none tried yet:
#    a. whether XLA's buffers are allocated compressible (ncu's "L2 Compression" section on
#       XLA's own AdamW fusion over the same arrays, below): if XLA's fusion shows the same,
#       the cost is shared by the baseline;
#    b. the epilogue's loads in flight with fewer registers (the spill) and the sub-tile
#       order (stop 26/36 sweeps varied slots and widths, not the spill);
#    c. fewer integer instructions in stochastic rounding that the compiler keeps per pair
#       (stop 39's PAIRED_BITS, commit 778ea9a, was slower: the hash stayed per element).
#    This call only profiles XLA's update fusion over one 4096x14336 W and its moments.
source devrun/env.sh
cat > /tmp/xla_update.py <<'PY'
import jax, jax.numpy as jnp
n, m = 4096, 14336
k = jax.random.key(0)
mk = lambda i, s=1.0: (s * jax.random.normal(jax.random.fold_in(k, i), (n, m))).astype(jnp.bfloat16)
def adamw(g, w, mu, nu):
  g, w32 = g.astype(jnp.float32), w.astype(jnp.float32)
  mu2 = 0.9 * mu.astype(jnp.float32) + 0.1 * g
  nu2 = 0.999 * nu.astype(jnp.float32) + 0.001 * g * g
  w2 = w32 - 1e-3 * (mu2 / 0.1 / (jnp.sqrt(nu2 / 0.001) + 1e-8) + 0.01 * w32)
  return w2.astype(w.dtype), mu2.astype(mu.dtype), nu2.astype(nu.dtype)
f = jax.jit(adamw, donate_argnums=(1, 2, 3))
st = f(mk(9), mk(1), mk(2, 1e-2), mk(3, 1e-4))
jax.block_until_ready(f(mk(9), *st))
PY
PYTHONPATH=. timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:fusion -c 2 python /tmp/xla_update.py > $OUT/ncu_xla_update.txt 2>&1
kill $SMI
grep -E "Duration|DRAM Throughput|Compression|Memory Throughput" $OUT/ncu_xla_update.txt

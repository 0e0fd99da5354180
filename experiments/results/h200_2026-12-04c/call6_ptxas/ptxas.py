"""Stop 38: ptxas's register/spill report for the default T=512 tile and the
staggered layout (commit 930c55f's kernel, shadowing the package)."""
import os, sys
import jax, jax.numpy as jnp
import pallas_kernels
print(pallas_kernels.__file__, flush=True)
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw.kernel_mosaic import MosaicConfig
from experiments.bench_fused_dw import RULES
from experiments.probe_mosaic import HP
rule = RULES["adamw"]
hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
k = jax.random.key(0)
x = jax.random.normal(k, (512, 4096), jnp.bfloat16)
dy = jax.random.normal(jax.random.fold_in(k, 1), (512, 14336), jnp.bfloat16)
w = jax.random.normal(jax.random.fold_in(k, 2), (4096, 14336), jnp.bfloat16)
st = (jnp.zeros_like(w) + 1e-3, jnp.zeros_like(w) + 1e-6)
for name, cfg in [("default", MosaicConfig(transpose_x=False)),
                  ("staggered", MosaicConfig(compute_wgs=2, staggered=True, transpose_x=False))]:
  print("=====", name, flush=True)
  out = jax.jit(lambda *a: fused_dw_update(*a, rule=rule, implementation="mosaic", config=cfg,
                                           seed=jnp.uint32(3)))(x, dy, w, st, hp)
  jax.block_until_ready(out)
  print("done", name, flush=True)

"""Stop 39: SASS of the default T=512 tile (4096->14336), AdamW bf16 W rounded
stochastically / to nearest, bf16 moments; and SGD to nearest."""
import sys
import jax, jax.numpy as jnp
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw.kernel_mosaic import MosaicConfig
from experiments.bench_fused_dw import RULES
from experiments.probe_mosaic import HP
which = sys.argv[1]
rule = RULES["sgd" if which.startswith("sgd") else "adamw"]
hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
k = jax.random.key(0)
T = int(sys.argv[2]) if len(sys.argv) > 2 else 512
x = jax.random.normal(k, (T, 4096), jnp.bfloat16)
dy = jax.random.normal(jax.random.fold_in(k, 1), (T, 14336), jnp.bfloat16)
w = jax.random.normal(jax.random.fold_in(k, 2), (4096, 14336), jnp.bfloat16)
st = () if rule is RULES["sgd"] else (jnp.zeros_like(w) + 1e-3, jnp.zeros_like(w) + 1e-6)
seed = jnp.uint32(3) if which.endswith("sr") else None
cfg = MosaicConfig(transpose_x=False)
out = jax.jit(lambda *a: fused_dw_update(*a, rule=rule, implementation="mosaic", config=cfg,
                                         seed=seed))(x, dy, w, st, hp)
jax.block_until_ready(out)
print("done", which, flush=True)

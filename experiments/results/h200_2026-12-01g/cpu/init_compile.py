import sys, time, functools
t0 = time.perf_counter()
import jax, jax.numpy as jnp, optax, flax.linen as nn
import forge_jax as fj
from forge_jax.models import llama
opt, layout = sys.argv[1], sys.argv[2]
cfg = llama.get_config("llama3.1-8b", max_seq_len=512, remat=True,
                       scan_layers=layout == "scan", dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
lr = 1e-4
if opt == "optax":
  dense, head, tx = nn.Dense, None, optax.adamw(lr, mu_dtype=jnp.bfloat16)
else:
  kw = dict(mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(lr, **kw))
  head = functools.partial(fj.ForgeDense, optimizer=fj.adamw(lr, **kw))
  tx = fj.adamw(lr, **kw)
model = llama.Llama(cfg, dense_cls=dense, head_cls=head)
x = jnp.zeros((1, 512), jnp.int32)
t1 = time.perf_counter()
lowered = jax.jit(model.init).lower(jax.random.key(0), x)
t2 = time.perf_counter()
c = lowered.compile()
t3 = time.perf_counter()
shapes = jax.eval_shape(model.init, jax.random.key(0), x)
t4 = time.perf_counter()
# tx.init on the non-fused params, abstractly (what TrainState.create runs eagerly)
from forge_jax._src import train_state as ts
paths = ts.fused_kernel_paths(shapes.get("forge_state", {}))
other, _ = ts.split_params(shapes["params"], paths)
lo = jax.jit(tx.init).lower(other); t5 = time.perf_counter(); lo.compile(); t6 = time.perf_counter()
print(f"{opt} {layout}: imports {t1-t0:.1f} init lower {t2-t1:.1f} compile {t3-t2:.1f} eval_shape {t4-t3:.1f} tx.init lower {t5-t4:.1f} compile {t6-t5:.1f}", flush=True)

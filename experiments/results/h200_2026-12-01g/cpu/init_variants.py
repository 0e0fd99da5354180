import sys, time, functools
import jax, jax.numpy as jnp, flax.linen as nn
import forge_jax as fj
from forge_jax.models import llama
variant, n_layers = sys.argv[1], int(sys.argv[2])
cfg = llama.get_config("llama3.1-8b", max_seq_len=512, remat=True, scan_layers=False,
                       dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, n_layers=n_layers)
if variant == "optax":
  dense = head = None; model = llama.Llama(cfg, dense_cls=nn.Dense, head_cls=None)
else:
  md = jnp.int8 if "int8" in variant else jnp.bfloat16
  kw = dict(mu_dtype=md, nu_dtype=md)
  dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-4, **kw),
                            stochastic_rounding="nosr" not in variant)
  model = llama.Llama(cfg, dense_cls=dense, head_cls=dense)
x = jnp.zeros((1, 512), jnp.int32)
t1 = time.perf_counter()
lowered = jax.jit(model.init).lower(jax.random.key(0), x)
t2 = time.perf_counter()
txt = lowered.as_text()
c = lowered.compile()
t3 = time.perf_counter()
print(f"{variant} L={n_layers}: lower {t2-t1:.1f} compile {t3-t2:.1f} hlo lines {txt.count(chr(10))}", flush=True)

"""Runs a few fused Llama-3.1-8B-shaped steps; prints each loss and the first non-finite leaves.

usage: python scanprobe.py LAYERS T LAYOUT IMPL [OPT]   (LAYOUT scan+remat / unrolled+remat; OPT int8/bf16)
"""
import functools, sys, time
import numpy as np
import jax, jax.numpy as jnp
import forge_jax as fj
from forge_jax.models import llama

L, T, layout, impl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
opt = sys.argv[5] if len(sys.argv) > 5 else "int8"
t0 = time.perf_counter()
cfg = llama.get_config("llama3.1-8b", n_layers=L, max_seq_len=T, remat="remat" in layout,
                       scan_layers=layout.startswith("scan"), dtype=jnp.bfloat16,
                       param_dtype=jnp.bfloat16, attention="cudnn" if jax.default_backend() == "gpu" else "einsum", logits_dtype=jnp.bfloat16)
mom = jnp.int8 if opt == "int8" else jnp.bfloat16
kw = dict(mu_dtype=mom, nu_dtype=mom)
d = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-4, **kw))
model = llama.Llama(cfg, dense_cls=d, head_cls=d,
                    embed_cls=functools.partial(fj.ForgeEmbed, optimizer=fj.adamw(1e-4, **kw)))
b = jax.random.randint(jax.random.key(1), (1, T + 1), 0, cfg.vocab_size)
batch = (b[:, :-1], b[:, 1:])
state = fj.TrainState.create(apply_fn=model.apply, variables=jax.jit(model.init)(jax.random.key(0), batch[0]),
                             tx=fj.adamw(1e-4, **kw))
step = fj.make_train_step(lambda v, bb: llama.cross_entropy_loss(model.apply(v, bb[0]), bb[1]),
                          check_backward=False, implementation=impl)
losses = []
for i in range(3):
  state, m = step(state, batch)
  losses.append(float(m["loss"]))
bad = []
for path, leaf in jax.tree_util.tree_leaves_with_path((state.params, state.forge_state)):
  a = np.asarray(jnp.asarray(leaf, jnp.float32)) if jnp.issubdtype(leaf.dtype, jnp.floating) else None
  if a is not None and not np.isfinite(a).all():
    bad.append(f"{jax.tree_util.keystr(path)} {np.mean(~np.isfinite(a)):.3g}")
print(f"RESULT L={L} T={T} {layout} {impl} {opt}: losses {losses} non-finite leaves {len(bad)} {bad[:6]} "
      f"({time.perf_counter() - t0:.0f} s)", flush=True)

"""One fused step of an L-layer scanned 8B-shaped Llama with the update ordering off and forced on, from
the same initial state; prints every leaf whose result differs (max |diff|, non-finite fraction).

usage: python nanprobe2.py L T LAYOUT IMPL OPT
"""
import functools, os, sys, time
import numpy as np
import jax, jax.numpy as jnp
import forge_jax as fj
from forge_jax._src import train_state as ts
from forge_jax.models import llama

ts._order_updates = lambda state, order_updates: bool(order_updates)
L, T, layout, impl, opt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
t0 = time.perf_counter()
cfg = llama.get_config(os.environ.get("MODEL", "llama3.1-8b"), n_layers=L, max_seq_len=T, remat="remat" in layout,
                       scan_layers=layout.startswith("scan"), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                       attention="cudnn" if jax.default_backend() == "gpu" else "einsum", logits_dtype=jnp.bfloat16)
mom = {"int8": jnp.int8, "bf16": jnp.bfloat16, "fp32": jnp.float32}[opt]
kw = dict(mu_dtype=mom, nu_dtype=mom)
d = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-4, **kw))
emb = os.environ.get("EMB", "forge")
model = llama.Llama(cfg, dense_cls=d, head_cls=d,
                    **({"embed_cls": functools.partial(fj.ForgeEmbed, optimizer=fj.adamw(1e-4, **kw))} if emb == "forge" else {}))
b = jax.random.randint(jax.random.key(1), (1, T + 1), 0, cfg.vocab_size)
batch = (b[:, :-1], b[:, 1:])
variables = jax.jit(model.init)(jax.random.key(0), batch[0])
loss = lambda v, bb: llama.cross_entropy_loss(model.apply(v, bb[0]), bb[1])
out = {}
for order in (False, True):
  state = fj.TrainState.create(apply_fn=model.apply, variables=jax.tree.map(jnp.copy, variables), tx=fj.adamw(1e-4, **kw))
  step = fj.make_train_step(loss, check_backward=False, implementation=impl, order_updates=order)
  s1, m = step(state, batch)
  s2, m2 = step(jax.tree.map(jnp.copy, s1), batch)
  out[order] = (jax.tree.map(np.asarray, (s1.params, s1.forge_state, s1.opt_state)), float(m["loss"]), float(m2["loss"]))
  del state, s1, s2
leaves = lambda t: jax.tree_util.tree_leaves_with_path(t)
diffs = []
for (p, a), (_, b_) in zip(leaves(out[False][0]), leaves(out[True][0])):
  a32, b32 = np.asarray(a, np.float64), np.asarray(b_, np.float64)
  if a32.shape != b32.shape or not np.array_equal(a32, b32, equal_nan=True):
    diffs.append(f"{jax.tree_util.keystr(p)} {a.shape} {a.dtype}: max|d| {np.nanmax(np.abs(a32 - b32)):.3g} "
                 f"nonfinite(ordered) {np.mean(~np.isfinite(b32)):.3g} nonfinite(plain) {np.mean(~np.isfinite(a32)):.3g} "
                 f"frac differing {np.mean(a32 != b32):.3g}")
print(f"RESULT {os.environ.get('TAG', '')} L={L} T={T} {layout} {impl} {opt} emb={emb}: loss1/loss2 plain {out[False][1:]} "
      f"ordered {out[True][1:]}; {len(diffs)} leaves differ ({time.perf_counter() - t0:.0f} s)", flush=True)
for line in diffs[:40]:
  print("  DIFF", line, flush=True)

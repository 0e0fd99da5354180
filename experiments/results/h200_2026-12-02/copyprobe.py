"""Compile-only probe: copies of fused kernels and temp in the unrolled fused step.

usage: python devrun/copyprobe.py MODEL LAYERS T VARIANTS  (VARIANTS: comma list of
fwdbar/nofwdbar[+bwdbar]); prints temp GiB and the kernel-shaped copies in the HLO.
"""
import collections, functools, re, sys, time
import jax, jax.numpy as jnp
from jax import lax
import forge_jax as fj
from forge_jax._src import dense
from pallas_kernels import quantization
from forge_jax.models import llama

model_name, layers, T, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
orig_matmul, orig_bwd = dense._matmul, dense._forge_linear_bwd


def plain_matmul(spec, x, kernel):
  return lax.dot_general(x, kernel.astype(spec.compute_dtype),
                         (((x.ndim - 1,), (0,)), ((), ())), precision=spec.precision)


def ordered_bwd(spec, residuals, dy):
  x, kernel, state, hparams, probe, seed = residuals
  kernel_dx = kernel
  state = quantization.from_float_view(state)
  spec.context.record_backward(spec.path)
  dx = lax.dot_general(dy, kernel_dx.astype(spec.compute_dtype),
                       (((dy.ndim - 1,), (1,)), ((), ())), precision=spec.precision).astype(x.dtype)
  if PRE:
    dx, kernel = lax.optimization_barrier((dx, kernel))
  new_kernel, new_state = dense._sharded_update(
      spec, x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]).astype(x.dtype),
      kernel, state, hparams, seed)
  if POST:  # the layer's update done before anything downstream of dx
    dx, new_kernel = lax.optimization_barrier((dx, new_kernel))
  import numpy as np
  probe_ct = jnp.ones_like(probe) + jnp.sum(dy[..., :0]).astype(probe.dtype)
  seed_ct = None if seed is None else np.zeros(np.shape(seed), jax.dtypes.float0)
  return (dx, new_kernel, quantization.as_float_view(new_state), jnp.zeros_like(hparams), probe_ct, seed_ct)


PRE = POST = False
for var in variants:
  dense._matmul = orig_matmul if "nofwdbar" not in var else plain_matmul
  PRE, POST = "bwdbar" in var, "postbar" in var
  dense._forge_linear.defvjp(dense._forge_linear_fwd, ordered_bwd if (PRE or POST) else orig_bwd)
  t0 = time.perf_counter()
  cfg = llama.get_config(model_name, n_layers=layers, max_seq_len=T, remat=True, dtype=jnp.bfloat16,
                         param_dtype=jnp.bfloat16, attention="cudnn" if jax.default_backend() == "gpu" else "einsum",
                         logits_dtype=jnp.bfloat16)
  kw = dict(mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  d = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-4, **kw))
  model = llama.Llama(cfg, dense_cls=d, head_cls=d,
                      embed_cls=functools.partial(fj.ForgeEmbed, optimizer=fj.adamw(1e-4, **kw)))
  tok = jax.ShapeDtypeStruct((1, T), jnp.int32)
  state = jax.eval_shape(lambda t: fj.TrainState.create(
      apply_fn=model.apply, variables=model.init(jax.random.key(0), t), tx=fj.adamw(1e-4, **kw)), tok)
  step = fj.make_train_step(lambda v, b: llama.cross_entropy_loss(model.apply(v, b[0]), b[1]),
                            check_backward=False, implementation="auto")
  compiled = step.lower(state, (tok, tok)).compile()
  ma = compiled.memory_analysis()
  txt = compiled.as_text()
  kshapes = set()
  for p in jax.tree.leaves(state.params):
    if p.ndim == 2:
      kshapes.add(f"{p.dtype}[{p.shape[0]},{p.shape[1]}]".replace("bfloat16", "bf16"))
  copies = collections.Counter()
  first = {}
  for line in txt.splitlines():
    m = re.match(r"\s*%?([\w.\-]+) = (\w+\[[\d,]*\])\{?[^ ]* copy\(", line)
    if m and m.group(2) in kshapes:
      copies[m.group(2)] += 1
      first.setdefault(m.group(2), (m.group(1), line.strip()[:300]))
  print(f"{var:22s} L={layers} T={T}: temp {ma.temp_size_in_bytes/2**30:.3f} GiB, args "
        f"{ma.argument_size_in_bytes/2**30:.2f}, kernel-shaped copies {dict(copies)}, "
        f"concatenates {txt.count(' concatenate(')}, {time.perf_counter()-t0:.0f} s", flush=True)
  for shape, (name, line) in list(first.items())[:3]:
    print("   ", line)
    users = [l.strip()[:260] for l in txt.splitlines() if re.search(rf"%{re.escape(name)}[,)\s]", l)]
    for u in users[:3]:
      print("      use:", u)

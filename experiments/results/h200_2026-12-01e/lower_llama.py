"""Time lowering the fused Llama-3.1-8B train step for CUDA on the CPU (jax 0.11.2):
    PYTHONPATH=. python lower_llama.py N_LAYERS unrolled|scan mosaic|triton
Stop 16 (CPU): 4 unrolled blocks 76.0 s before the shared kernel lowering, 11.1 s after."""
import functools, sys, time, dataclasses
import jax, jax.numpy as jnp
import forge_jax as fj
from forge_jax.models import llama
from pallas_kernels.fused_dw import api
api._require_gpu = lambda *a: None
layers, layout, impl = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 2048
cfg = llama.get_config("llama3.1-8b", max_seq_len=T, remat=True, scan_layers=layout == "scan",
                       dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, attention="einsum",
                       logits_dtype=jnp.bfloat16)
cfg = dataclasses.replace(cfg, n_layers=layers)
kw = dict(mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-4, **kw))
model = llama.Llama(cfg, dense_cls=dense, head_cls=dense)
batch = (jax.ShapeDtypeStruct((1, T), jnp.int32), jax.ShapeDtypeStruct((1, T), jnp.int32))
state = jax.eval_shape(lambda: fj.TrainState.create(
    apply_fn=model.apply, variables=model.init(jax.random.key(0), jnp.zeros((1, T), jnp.int32)),
    tx=fj.adamw(1e-4, **kw)))
def loss_fn(v, b):
  return llama.cross_entropy_loss(model.apply(v, b[0]), b[1])
step = fj.make_train_step(loss_fn, check_backward=False, implementation=impl)
t0 = time.time()
tr = step.jitted.trace(state, batch)
t1 = time.time()
low = tr.lower(lowering_platforms=("cuda",))
t2 = time.time()
txt = low.as_text()
print(f"{layers} layers {layout} {impl}: trace {t1-t0:.1f}s lower {t2-t1:.1f}s  "
      f"mosaic calls {txt.count('custom_call @mosaic_gpu')} triton {txt.count('xla.gpu.triton')} "
      f"text {len(txt)/1e6:.1f} MB", flush=True)

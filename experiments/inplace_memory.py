"""In-place check: a stack of ForgeDense layers, fused step vs optax baseline.

For each variant (run in its own process, so that ``peak_bytes_in_use`` is
that variant's alone) this compiles one jitted training step with params and
optimizer state donated, then reports:

* XLA's ``memory_analysis()`` (arguments, outputs, aliased, temp),
* the number of full-size ``copy`` instructions in the compiled HLO whose
  shape is that of a fused kernel or moment (must be 0 for the fused step),
* live ``memory_stats()['peak_bytes_in_use']`` after 3 steps,
* the median step time.

Variants: ``optax`` (flax Dense + optax.adamw, unfused), ``fused-xla``
(ForgeDense, custom_vjp with the XLA reference), ``fused-triton`` (ForgeDense
with the Pallas kernel; GPU only).

    python -m experiments.inplace_memory --layers 8 --width 4096 --tokens 2048
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Config:
  layers: int = 8
  width: int = 4096
  tokens: int = 2048
  dtype: str = "bfloat16"  # activation / matmul dtype; params stay fp32
  steps: int = 10
  out: str = "experiments/results"


def _model(cfg: Config, fused: bool):
  import flax.linen as nn
  import jax.numpy as jnp

  import forge_jax as fj

  opt = fj.adamw(1e-3, weight_decay=0.01)

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      # An unfused input projection, so that every fused layer's input needs a
      # gradient, as in a transformer (whose first input is an embedding).
      x = nn.Dense(cfg.width, use_bias=False, dtype=cfg.dtype, name="in_proj")(x)
      for i in range(cfg.layers):
        if fused:
          layer = fj.ForgeDense(cfg.width, use_bias=False, dtype=cfg.dtype,
                                optimizer=opt, name=f"layers_{i}")
        else:
          layer = nn.Dense(cfg.width, use_bias=False, dtype=cfg.dtype,
                           name=f"layers_{i}")
        x = x + nn.gelu(layer(x)).astype(x.dtype)
      return x

  del jnp
  return Stack(), opt


def run_variant(cfg: Config, variant: str) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax

  import forge_jax as fj

  fused = variant != "optax"
  model, opt = _model(cfg, fused)
  x = jnp.asarray(np.random.default_rng(0).standard_normal(
      (cfg.tokens, cfg.width)), cfg.dtype)
  target = jnp.asarray(np.random.default_rng(1).standard_normal(
      (cfg.tokens, cfg.width)), cfg.dtype)
  batch = (x, target)
  variables = jax.jit(model.init)(jax.random.key(0), x)

  def mse(out, t):
    return jnp.mean((out.astype(jnp.float32) - t.astype(jnp.float32))**2)

  if fused:
    impl = variant.split("-", 1)[1]
    state = fj.TrainState.create(apply_fn=model.apply, variables=variables,
                                 tx=optax.adamw(1e-3, weight_decay=0.01))

    def loss_fn(v, b):
      return mse(model.apply(v, b[0]), b[1])

    step = fj.make_train_step(loss_fn, implementation=impl)
    args = (state, batch)
  else:
    tx = opt  # the same AdamW, unfused, through optax
    params = variables["params"]
    opt_state = tx.init(params)

    def plain_step(params, opt_state, b):
      loss, grads = jax.value_and_grad(
          lambda p: mse(model.apply({"params": p}, b[0]), b[1]))(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(plain_step, donate_argnums=(0, 1))
    args = (params, opt_state, batch)

  compiled = step.lower(*args).compile()
  ma = compiled.memory_analysis()
  hlo = compiled.as_text()
  full = f"f32[{cfg.width},{cfg.width}]"
  copies = [ln.strip() for ln in hlo.splitlines()
            if re.search(r"=\s*" + re.escape(full) + r"\{?[^ ]*\s+copy(-start)?\(", ln)]
  custom_calls = len(re.findall(r"custom-call\(", hlo))

  def run(args):
    out = step(*args)
    jax.block_until_ready(out)
    return out

  times = []
  for i in range(cfg.steps):
    t0 = time.perf_counter()
    out = run(args)
    times.append(time.perf_counter() - t0)
    args = (out[0], batch) if fused else (out[0], out[1], batch)
  stats = jax.devices()[0].memory_stats() or {}
  return {
      "variant": variant,
      "argument_gib": ma.argument_size_in_bytes / GiB,
      "output_gib": ma.output_size_in_bytes / GiB,
      "alias_gib": ma.alias_size_in_bytes / GiB,
      "temp_gib": ma.temp_size_in_bytes / GiB,
      "peak_gib": stats.get("peak_bytes_in_use", float("nan")) / GiB,
      "step_ms": 1e3 * sorted(times[2:])[len(times[2:]) // 2],
      "full_size_copies": len(copies),
      "copy_lines": copies[:4],
      "custom_calls": custom_calls,
      "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind),
      "jax": jax.__version__,
  }


def main(cfg: Config, variants: list[str]) -> list[dict]:
  rows = []
  for v in variants:
    cmd = [sys.executable, "-m", "experiments.inplace_memory", "--variant", v,
           "--layers", str(cfg.layers), "--width", str(cfg.width),
           "--tokens", str(cfg.tokens), "--dtype", cfg.dtype,
           "--steps", str(cfg.steps)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
      print(res.stdout[-2000:], res.stderr[-4000:], file=sys.stderr)
      rows.append({"variant": v, "error": res.stderr.strip().splitlines()[-1:]})
      continue
    rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
  os.makedirs(cfg.out, exist_ok=True)
  path = os.path.join(cfg.out, f"inplace_memory_{int(time.time())}.json")
  with open(path, "w") as f:
    json.dump({"config": dataclasses.asdict(cfg), "rows": rows}, f, indent=1)
  state_gib = 3 * cfg.layers * cfg.width**2 * 4 / GiB
  print(f"\n{cfg.layers} layers {cfg.width}x{cfg.width} fp32 kernels + AdamW mu/nu "
        f"({state_gib:.2f} GiB), {cfg.tokens} tokens, {cfg.dtype} matmuls; {path}")
  hdr = ("variant", "args GiB", "out GiB", "alias GiB", "temp GiB",
         "live peak GiB", "step ms", "full-size copies")
  print("| " + " | ".join(hdr) + " |")
  print("|" + "---|" * len(hdr))
  for r in rows:
    if "error" in r:
      print(f"| {r['variant']} | error: {r['error']} |")
      continue
    print(f"| {r['variant']} | {r['argument_gib']:.3f} | {r['output_gib']:.3f} | "
          f"{r['alias_gib']:.3f} | {r['temp_gib']:.3f} | {r['peak_gib']:.3f} | "
          f"{r['step_ms']:.2f} | {r['full_size_copies']} |")
  return rows


if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--layers", type=int, default=Config.layers)
  p.add_argument("--width", type=int, default=Config.width)
  p.add_argument("--tokens", type=int, default=Config.tokens)
  p.add_argument("--dtype", default=Config.dtype)
  p.add_argument("--steps", type=int, default=Config.steps)
  p.add_argument("--variant", default=None, help="run one variant in-process")
  p.add_argument("--variants", default=None,
                 help="comma-separated; default optax,fused-xla[,fused-triton]")
  a = p.parse_args()
  cfg = Config(layers=a.layers, width=a.width, tokens=a.tokens, dtype=a.dtype,
               steps=a.steps)
  if a.variant:
    print(json.dumps(run_variant(cfg, a.variant)))
  else:
    import jax
    vs = a.variants.split(",") if a.variants else (
        ["optax", "fused-xla"] + (["fused-triton"] if jax.default_backend() == "gpu" else []))
    main(cfg, vs)

"""What the compiler made of the fused kernel: tensor-core instructions,
register spills, and hidden copies of the aliased W and state.

Compiles ``fused_dw_update`` (jitted, W and state donated, as in training)
for one shape, rule and state format with XLA's dump enabled, then reports

* from the PTX (or LLVM IR) XLA dumps for the module: Hopper tensor-core ``wgmma.mma_async``
  instructions against the older ``mma.sync``, and local-memory traffic
  (``ld.local`` / ``st.local``: registers spilled to memory);
* from the optimized HLO: the fused custom call's operand/output aliasing and
  every ``copy`` in the module (a copy of W or a state would mean the
  in-place update is not in place).

    python -m experiments.inspect_fused_dw --shape 2048:4096x14336 --mode fp32
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import tempfile

_DUMP = tempfile.mkdtemp(prefix="forge_dump_")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={_DUMP} --xla_dump_hlo_as_text"
                           " --xla_gpu_dump_llvmir")

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments import bench_fused_dw as bench  # noqa: E402
from pallas_kernels import quantization  # noqa: E402
from pallas_kernels.fused_dw import FusedDWConfig, fused_dw_update  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shape", default="2048:4096x14336")
  p.add_argument("--rule", default="adamw")
  p.add_argument("--mode", default="fp32", choices=list(bench.MODES))
  p.add_argument("--config", default="",
                 help="bm,bn,bt,warps,stages[,T] (T: transpose_x); default: "
                 "the cached or heuristic one")
  a = p.parse_args(argv)
  t, dims = a.shape.split(":")
  t, (d_in, d_out) = int(t), map(int, dims.split("x"))
  rule = {**bench.RULES, **bench.FOLD_RULES}[a.rule]
  w_dtype, s_dtype, sr = bench.MODES[a.mode]
  config = None
  if a.config:
    f = a.config.split(",")
    config = FusedDWConfig(*map(int, f[:3]), 8, *map(int, f[3:5]),
                           transpose_x=len(f) > 5 and f[5] == "T")
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)
  w = jnp.zeros((d_in, d_out), w_dtype)
  shape = rule.state_shape((d_in, d_out))
  state = tuple(
      quantization.quantize(jnp.zeros(shape), n in rule.nonnegative_states)
      if jnp.dtype(s_dtype) == jnp.int8 else jnp.zeros(shape, s_dtype)
      for n in rule.state_names)
  hp = rule.pack({n: bench.HYPERPARAMS[n] for n in rule.hyperparam_names}, 1)
  seed = jnp.uint32(1) if sr else None
  fn = jax.jit(lambda x, dy, w, s, hp: fused_dw_update(
      x, dy, w, s, hp, rule=rule, implementation="triton", config=config,
      seed=seed), donate_argnums=(2, 3))
  hlo = fn.lower(x, dy, w, state, hp).compile().as_text()
  jax.block_until_ready(fn(x, dy, w, state, hp))
  files = [f for f in glob.glob(f"{_DUMP}/**/*", recursive=True)
           if f.endswith((".ptx", ".ll"))]
  ptx = "".join(open(f, errors="replace").read() for f in files)
  if not files:
    print("no .ptx/.ll in the dump; it holds:",
          sorted(os.path.basename(f) for f in glob.glob(f"{_DUMP}/*"))[:20])
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}: T={t} "
        f"{d_in}->{d_out}, {a.rule}, {a.mode}, config={config or 'default'}")
  print(f"PTX/LLVM files: {len(files)}, {len(ptx)} chars")
  for ins in ("wgmma.mma_async", "nvvm.wgmma", "mma.sync", "ld.local", "st.local",
              "cp.async.bulk.tensor", "cp.async.cg", "cp.async.ca", "ldmatrix"):
    print(f"  {ins:24s} {ptx.count(ins)}")
  print("HLO copies:", len(re.findall(r"= \S+ copy\(", hlo)),
        "| custom calls:", len(re.findall(r"custom-call\(", hlo)))
  for line in hlo.splitlines():
    if "input_output_alias" in line or " copy(" in line:
      print("  " + line.strip()[:300])
  out = os.environ.get("OUT")
  if out:
    with open(os.path.join(out, f"inspect_{a.rule}_{a.mode}_T{t}.hlo.txt"), "w") as f:
      f.write(hlo)


if __name__ == "__main__":
  main()

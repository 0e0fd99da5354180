"""Stop 27, CPU: how far does a model's first fused AdamW step move when the
inputs of each layer's update differ from the reference's at bf16 rounding
scale, with the same rounding bits?

Runs experiments.check_fused_model with the variants xla (reference), triton,
xla:seed1 (control), where 'triton' is REPLACED here by the XLA reference
update computed on dY * (1 + r * 2**-8), r uniform in [-1, 1] per element
(about one bf16 ulp): the kind of difference XLA's compiling the program
around a kernel differently would give its inputs. Nothing else changes.

    PYTHONPATH=$PWD python experiments/results/h200_2026-12-03b/cpu_sensitivity/perturb.py \
        --model 60m --layers 2 --tokens 512
"""
import dataclasses
import sys
import zlib

import jax
import jax.numpy as jnp

from experiments import check_fused_model
from forge_jax._src import dense

_orig = dense._sharded_update  # pylint: disable=protected-access


def _perturbed(spec, x, dy, kernel, state, hparams, seed):
  if spec.implementation != "triton":
    return _orig(spec, x, dy, kernel, state, hparams, seed)
  key = jax.random.fold_in(jax.random.key(7), zlib.crc32("/".join(spec.path).encode()) % 2**31)
  r = jax.random.uniform(key, dy.shape, jnp.float32, -1.0, 1.0)
  dy = (dy.astype(jnp.float32) * (1 + r * 2.0**-8)).astype(dy.dtype)
  spec = dataclasses.replace(spec, implementation="xla")
  return _orig(spec, x, dy, kernel, state, hparams, seed)


dense._sharded_update = _perturbed  # pylint: disable=protected-access
print("NOTE: the 'triton' column is the XLA reference on dY perturbed by ~1 bf16 ulp")
sys.exit(check_fused_model.main(sys.argv[1:] + [
    "--variants", "xla,triton,xla:seed1", "--steps", "1", "--leaves", "params"]))

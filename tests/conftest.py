"""Shared test helpers."""

import os
import zlib

# Two CPU devices, for the tests of sharded and mapped execution. Set before
# jax initializes its backends; it does not change a GPU's device count.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=2").strip()

# LLVM at -O0 for the CPU programs the tests compile: XLA's CPU compile is
# most of the suite's time and the programs are small, so the suite runs
# about a quarter faster (stop 42: 617 against 459-468 s on 2 cores). The
# level is LLVM's code generation only: XLA's HLO passes and buffer
# assignment (the tests' memory_analysis) are unchanged. Results can differ
# where LLVM would have contracted a multiply and an add into one FMA, and a
# step can amplify that (stop 42's review: the TP=2 cpu-tiny loss after one
# step moved by 1.1e-4 relative), within every test's tolerance. CPU runs
# only: XLA's GPU backend reads the same flag and does not support levels
# below 2, so a machine with an NVIDIA device (unless JAX_PLATFORMS=cpu)
# keeps XLA's default. A caller's own level wins.
import glob  # noqa: E402
if ("xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]
    and (os.environ.get("JAX_PLATFORMS", "").lower() == "cpu"
         or not glob.glob("/dev/nvidia[0-9]*"))):
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"

# The fused kernel's tuning cache (pallas_kernels/fused_dw/autotune.py): a
# fresh, empty one for the test session, never the user's.
import tempfile  # noqa: E402
os.environ["FORGE_JAX_AUTOTUNE_CACHE"] = os.path.join(
    tempfile.mkdtemp(prefix="forge_jax_tune_"), "fused_dw_autotune.json")

# JAX's persistent compilation cache, in a fresh directory per test session
# (pytest-xdist's workers inherit it; never the user's): many tests compile the same step several times (a run,
# then its resume, then a resumed run), and XLA's CPU compile is most of their
# time. A caller's own JAX_COMPILATION_CACHE_DIR wins. Tests that need XLA to
# compile (its dump files) turn the cache off in their subprocess.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="forge_jax_jit_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax
import numpy as np
import pytest

ON_GPU = jax.default_backend() == "gpu"


def lower_for_cuda(jitted, *args):
  """``jitted.trace(*args).lower(lowering_platforms=("cuda",))`` anywhere.

  A Triton ``pallas_call`` reads the GPU's compute capability while it is
  lowered; without a GPU, jax 0.11 wants an abstract GPU device, set while
  the function is traced ("No supported GPU devices found, please specify
  an abstract GPU device using AbstractDevice"), so both run under a
  one-device abstract mesh of an NVIDIA H200 (the GPU the benchmarks use).
  On a GPU, as is.
  """
  if ON_GPU:
    return jitted.trace(*args).lower(lowering_platforms=("cuda",))
  mesh = jax.sharding.AbstractMesh(
      (1,), ("lowering",), abstract_device=jax.sharding.AbstractDevice(
          "NVIDIA H200", None, "gpu"))
  with jax.sharding.use_abstract_mesh(mesh):
    return jitted.trace(*args).lower(lowering_platforms=("cuda",))


def dots_per_loop(closed_jaxpr) -> list[int]:
  """dot_general equations in each outermost loop (scan or while) of a
  program, in program order; nested loops count toward theirs. (A
  ``fori_loop`` with static bounds is traced as a scan.)"""
  from jax.extend.core import jaxprs_in_params
  found = []

  def count(jaxpr):
    return sum(eqn.primitive.name == "dot_general" for eqn in jaxpr.eqns) + sum(
        count(sub) for eqn in jaxpr.eqns for sub in jaxprs_in_params(eqn.params))

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name in ("scan", "while"):
        found.append(sum(count(sub) for sub in jaxprs_in_params(eqn.params)))
      else:
        for sub in jaxprs_in_params(eqn.params):
          walk(sub)
  walk(closed_jaxpr.jaxpr)
  return found


def rel_err(a, b) -> float:
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture
def rng(request):
  # A fresh stream per test, reproducible from the test's name.
  seed = zlib.crc32(request.node.nodeid.encode())
  return np.random.default_rng(seed)

# On a GPU, XLA's default fp32 matmul uses TF32; the fused kernel and the
# references compute fp32 products exactly, so the tests compare at full
# precision everywhere (this changes nothing on the CPU).
jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def in_place_requests(monkeypatch):
  """The ``in_place`` of every ``pallas_kernels.fused_dw.fused_dw_update``
  call made through the package (ForgeDense's fused updates), in order."""
  from pallas_kernels import fused_dw  # pylint: disable=g-import-not-at-top
  seen = []
  update = fused_dw.fused_dw_update
  monkeypatch.setattr(fused_dw, "fused_dw_update",
                      lambda *a, **kw: seen.append(kw["in_place"]) or update(*a, **kw))
  return seen


@pytest.fixture
def on_cpu():
  """Runs a test on host CPUs (the 2-device mesh tests), also on a GPU machine."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


# ---------------------------------------------------------------------------
# Fused against unfused: the same two-layer MLP trained by a fused step and by
# flax Dense + the same optax transform on materialized gradients.

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import forge_jax as fj  # noqa: E402


class TwoLayerMLP(nn.Module):
  """x (..., 13) -> tanh(fc1) -> fc2: ForgeDense layers, or flax Dense."""

  optimizer: object = None
  fused: bool = True
  widths: tuple = (19, 7)
  param_dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x):
    def dense(f, name):
      if self.fused:
        return fj.ForgeDense(f, optimizer=self.optimizer, name=name,
                             param_dtype=self.param_dtype)
      return nn.Dense(f, name=name, param_dtype=self.param_dtype)
    return dense(self.widths[1], "fc2")(nn.tanh(dense(self.widths[0], "fc1")(x)))


def fused_and_unfused(rng, make_tx, *, implementation, interpret, widths=(19, 7),
                      steps=5):
  """Trains both for ``steps`` from one init; returns
  ``(fused_state, unfused_params, unfused_opt_state, jit_cache_sizes)``."""
  x = jnp.asarray(rng.standard_normal((3, 11, 13)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((3, 11, widths[1])), jnp.float32)
  fused = TwoLayerMLP(make_tx(), widths=widths)
  plain = TwoLayerMLP(fused=False, widths=widths)
  v = fused.init(jax.random.key(0), x)
  state = fj.TrainState.create(apply_fn=fused.apply,
                               variables=jax.tree.map(jnp.copy, v), tx=make_tx())
  step = fj.make_train_step(
      lambda vv, b: jnp.mean((fused.apply(vv, b[0]) - b[1]) ** 2),
      implementation=implementation, interpret=interpret)
  tx = make_tx()
  params = jax.tree.map(jnp.copy, v["params"])
  opt_state = tx.init(params)

  @jax.jit
  def plain_step(params, opt_state):
    g = jax.grad(lambda p: jnp.mean((plain.apply({"params": p}, x) - y) ** 2))(params)
    u, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, u), opt_state

  sizes = []
  for _ in range(steps):
    state, _ = step(state, (x, y))
    params, opt_state = plain_step(params, opt_state)
    sizes.append(step._cache_size())  # pylint: disable=protected-access
  return state, params, opt_state, sizes


def triton_text_with_int8_state(rule, t, d_in, d_out, min_block_n,
                                sharded_rounding=False):
  """StableHLO text of the compiled kernel path (lowered for CUDA, no GPU
  needed) with bf16 operands and int8 mu/nu, W and both states donated;
  ``sharded_rounding``: stochastic rounding of W with the global index of a
  shard (``index_offset``, ``index_width``) as under tensor parallelism."""
  from pallas_kernels import quantization as q  # pylint: disable=g-import-not-at-top
  from pallas_kernels.fused_dw import FusedDWConfig  # pylint: disable=g-import-not-at-top
  from pallas_kernels.fused_dw import kernel_triton  # pylint: disable=g-import-not-at-top

  def f(x, dy, w, mc, ms, nc, ns, hp):
    state = (q.QuantizedArray(mc, ms), q.QuantizedArray(nc, ns, True))
    kw = dict(seed=jnp.uint32(5), index_offset=(jnp.int32(64), 0),
              index_width=2 * d_out) if sharded_rounding else {}
    return kernel_triton.fused_dw_update_triton(
        x, dy, w, state, hp, rule=rule, interpret=False,
        config=FusedDWConfig.default(t, d_in, d_out, jnp.bfloat16,
                                     min_block_n=min_block_n), **kw)

  sds = jax.ShapeDtypeStruct
  shape = rule.state_shape((d_in, d_out))
  codes = sds(shape, jnp.int8)
  scales = sds(q.scale_shape(shape), jnp.float32)
  args = ([sds((t, d_in), jnp.bfloat16), sds((t, d_out), jnp.bfloat16),
           sds((d_in, d_out), jnp.bfloat16)] + [codes, scales] * 2
          + [sds((rule.num_hyperparams,), jnp.float32)])
  return lower_for_cuda(jax.jit(f, donate_argnums=(2, 3, 4, 5, 6)), *args).as_text()

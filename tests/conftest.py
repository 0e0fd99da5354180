"""Shared test helpers."""

import os
import zlib

# Two CPU devices, for the tests of sharded and mapped execution. Set before
# jax initializes its backends; it does not change a GPU's device count.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=2").strip()

# The fused kernel's tuning cache (pallas_kernels/fused_dw/autotune.py): a
# fresh, empty one for the test session, never the user's.
import tempfile  # noqa: E402
os.environ["FORGE_JAX_AUTOTUNE_CACHE"] = os.path.join(
    tempfile.mkdtemp(prefix="forge_jax_tune_"), "fused_dw_autotune.json")

import jax
import numpy as np
import pytest

ON_GPU = jax.default_backend() == "gpu"


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
def on_cpu():
  """Runs a test on host CPUs (the 2-device mesh tests), also on a GPU machine."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield

"""The fused kernel's autotuner: checks candidates, caches the fastest, and
fused_dw_update picks the cached tile."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from forge_jax.rules import ADAMW
from pallas_kernels import quantization as q
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import autotune
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import kernel_triton


@pytest.fixture
def cache(tmp_path, monkeypatch):
  path = tmp_path / "tune.json"
  monkeypatch.setenv("FORGE_JAX_AUTOTUNE_CACHE", str(path))
  return path


def _op(rng, int8=False):
  t, d_in, d_out = 40, 48, 130
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  mu = jnp.asarray(0.1 * rng.standard_normal((d_in, d_out)), jnp.float32)
  nu = mu * mu
  state = (q.quantize(mu), q.quantize(nu, True)) if int8 else (mu, nu)
  hp = ADAMW.pack(dict(learning_rate=1e-2, b1=0.9, b2=0.99, eps=1e-8,
                       weight_decay=0.1), 3)
  return x, dy, w, state, hp


def test_autotune_records_the_fastest_and_the_op_uses_it(rng, cache, monkeypatch):
  x, dy, w, state, hp = _op(rng)
  configs = [FusedDWConfig(16, 32, 16, 2, 4, 1), FusedDWConfig(32, 64, 16, 1, 4, 1),
             FusedDWConfig(16, 32, 16)]  # the first tile, other launch settings
  best, results = autotune.autotune(x, dy, w, state, hp, rule=ADAMW, configs=configs,
                                    reps=2, interpret=True)
  assert best in configs and all("seconds" in r for r in results)
  data = json.loads(cache.read_text())
  key = autotune.cache_key(x, w, state, ADAMW, False)
  assert list(data) == [key] and FusedDWConfig(**data[key]["config"]) == best
  assert autotune.lookup(key) == best

  seen = []
  real = kernel_triton.fused_dw_update_triton

  def spy(*args, config, **kw):
    seen.append(config)
    return real(*args, config=config, **kw)

  monkeypatch.setattr(kernel_triton, "fused_dw_update_triton", spy)
  fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                  interpret=True)
  assert seen == [best]
  # Another shape was never tuned: the heuristic default.
  fused_dw_update(x[:, :40], dy, w[:40], (state[0][:40], state[1][:40]), hp,
                  rule=ADAMW, implementation="triton", interpret=True)
  assert seen[-1] == FusedDWConfig.default(40, 40, 130, jnp.float32)


def test_candidates_that_fail_are_skipped_and_reported(rng, cache):
  x, dy, w, state, hp = _op(rng, int8=True)
  configs = [FusedDWConfig(16, 32, 16), FusedDWConfig(16, 64, 16, 2, 4, 1)]
  best, results = autotune.autotune(x, dy, w, state, hp, rule=ADAMW, configs=configs,
                                    reps=1, interpret=True)
  assert best == configs[1]
  assert "block_n=32 must be a multiple of 64" in results[0]["error"]
  with pytest.raises(RuntimeError, match="no candidate worked"):
    autotune.autotune(x, dy, w, state, hp, rule=ADAMW, configs=configs[:1], reps=1,
                      interpret=True)


def test_candidate_grid_respects_the_rule():
  grid = autotune.candidates(4096, 14336, min_block_n=64)
  assert grid and all(c.block_n % 64 == 0 and c.block_m * c.block_n <= 128 * 256
                      for c in grid)
  assert all(c.block_n >= 512 for c in autotune.candidates(4096, 4096, 512))
  assert np.unique([(c.block_m, c.block_n) for c in grid], axis=0).shape[0] > 3

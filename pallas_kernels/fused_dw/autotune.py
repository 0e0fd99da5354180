"""A small autotuner for the fused kernel's tile configuration, with a cache.

:func:`autotune` times a few :class:`FusedDWConfig` candidates on the real
operands (each checked against the reference first) and records the fastest
in a JSON cache keyed by device, jax version, shapes, dtypes, rule and state
formats. :func:`pallas_kernels.fused_dw.fused_dw_update` with ``config=None``
looks the key up (at trace time, from an in-memory copy of the file) and falls
back to :meth:`FusedDWConfig.default` when the shape was never tuned, so a
tuned run and an untuned one compute the same numbers, only at different
speeds.

The cache file is ``$FORGE_JAX_AUTOTUNE_CACHE`` or
``~/.cache/forge_jax/fused_dw_autotune.json``; it is written atomically.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import quantization
from pallas_kernels.fused_dw.kernel_triton import FusedDWConfig


def cache_path() -> str:
  """The JSON cache file (``$FORGE_JAX_AUTOTUNE_CACHE`` or the default)."""
  env = os.environ.get("FORGE_JAX_AUTOTUNE_CACHE")
  if env:
    return env
  return os.path.join(os.path.expanduser("~"), ".cache", "forge_jax",
                      "fused_dw_autotune.json")


def _kind(s) -> str:
  if isinstance(s, quantization.QuantizedArray):
    return "int8-nonneg" if s.nonnegative else "int8"
  return jnp.dtype(s.dtype).name


def cache_key(x, w, state, rule, seeded: bool) -> str:
  """The key of one fused op: device, jax, T/in/out, dtypes, rule, states."""
  device = jax.devices()[0].device_kind if jax.devices() else "none"
  return "|".join([
      device, jax.__version__, f"T{x.shape[0]}", f"{w.shape[0]}x{w.shape[1]}",
      jnp.dtype(x.dtype).name, jnp.dtype(w.dtype).name, rule.name,
      ",".join(_kind(s) for s in state), "sr" if seeded else "rn"])


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict:
  del mtime  # part of the lru key: a rewritten file is read again
  with open(path) as f:
    return json.load(f)


def _read(path: str) -> dict:
  try:
    return _load(path, os.path.getmtime(path))
  except (FileNotFoundError, json.JSONDecodeError):
    return {}


def lookup(key: str) -> FusedDWConfig | None:
  """The tuned configuration for ``key``, or None."""
  entry = _read(cache_path()).get(key)
  if entry is None:
    return None
  return FusedDWConfig(**entry["config"])


def record(key: str, config: FusedDWConfig, seconds: float) -> None:
  """Writes ``config`` for ``key`` into the cache file (atomically)."""
  path = cache_path()
  data = dict(_read(path))
  data[key] = {"config": dataclasses.asdict(config), "seconds": seconds,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
  with os.fdopen(fd, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def candidates(d_in: int, d_out: int, min_block_n: int) -> list[FusedDWConfig]:
  """A small grid of tiles that fit the rule's constraints (and registers)."""
  out = []
  for bm in (32, 64, 128):
    for bn in (64, 128, 256, 512, 1024):
      if bn % min_block_n or bn < min_block_n or bm * bn > 128 * 256:
        continue
      if bm > 2 * max(d_in, 16) or bn > 2 * max(d_out, min_block_n):
        continue
      # (64, 8, 4): the best AdamW tile at T=8192 on the H200 (probe_fused_dw)
      for bt, warps, stages in ((32, 4, 3), (64, 8, 3), (64, 8, 4), (32, 8, 4),
                                (64, 4, 4)):
        out.append(FusedDWConfig(bm, bn, bt, 8, warps, stages))
      # The epilogue in two column chunks (fewer registers, see
      # FusedDWConfig.default) where each chunk still holds whole blocks.
      if bm * bn >= 128 * 64 and bn // 2 >= max(min_block_n, 16):
        out.append(FusedDWConfig(bm, bn, 64, 8, 8, 4, epilogue_split=2))
  return out


def autotune(x, dy, w, state: Sequence, hparams, *, rule, seed=None,
             configs: Sequence[FusedDWConfig] | None = None, reps: int = 20,
             interpret: bool = False, write: bool = True, rtol: float = 1e-4):
  """Times candidate tiles for one fused op and caches the fastest.

  Args:
    x, dy, w, state, hparams, rule, seed: as ``fused_dw_update`` (the values
      only serve as inputs; nothing is updated in place).
    configs: candidates (default :func:`candidates`).
    reps: timed runs per candidate (median).
    interpret: run in interpret mode (tests on the CPU).
    write: record the winner in the cache.
    rtol: a candidate whose result differs from the reference by more than
      this (relative, per output) is rejected.

  Returns:
    ``(best_config, results)``, results a list of dicts (config, seconds or
    error) in the order tried.

  Raises:
    RuntimeError: if no candidate compiled and matched the reference.
  """
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  state = tuple(state)
  min_bn = api.triton_min_block_n(rule, state)
  if configs is None:
    configs = candidates(w.shape[0], w.shape[1], min_bn)
  want = api.fused_dw_update_reference(x, dy, w, state, hparams, rule=rule, seed=seed)
  want_leaves = [np.asarray(quantization.state_to_f32(a) if isinstance(
      a, quantization.QuantizedArray) else a, np.float64)
                 for a in (want[0], *want[1])]
  results, best = [], None
  for cfg in configs:
    # W and state donated and fed back, as in training (no hidden copies).
    fn = jax.jit(functools.partial(
        api.fused_dw_update, rule=rule, implementation="triton", config=cfg,
        interpret=interpret, seed=seed), donate_argnums=(2, 3))
    copy = lambda: (jnp.copy(w), jax.tree.map(jnp.copy, state))  # noqa: E731
    try:
      got = fn(x, dy, *copy(), hparams)
      jax.block_until_ready(got)
      for g, r in zip((got[0], *got[1]), want_leaves):
        g = np.asarray(quantization.state_to_f32(g) if isinstance(
            g, quantization.QuantizedArray) else g, np.float64)
        err = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)
        if not err <= rtol:
          raise ValueError(f"differs from the reference: rel err {err:.2e}")
      times, carry = [], got
      for _ in range(reps):
        t0 = time.perf_counter()
        carry = fn(x, dy, carry[0], carry[1], hparams)
        jax.block_until_ready(carry)
        times.append(time.perf_counter() - t0)
      seconds = float(np.median(times))
      results.append({"config": dataclasses.asdict(cfg), "seconds": seconds})
      if best is None or seconds < best[1]:
        best = (cfg, seconds)
    except Exception as e:  # noqa: BLE001 -- a candidate that fails is skipped
      results.append({"config": dataclasses.asdict(cfg),
                      "error": f"{type(e).__name__}: {str(e)[:160]}"})
  if best is None:
    raise RuntimeError(f"autotune: no candidate worked: {results[:3]}")
  if write:
    record(cache_key(x, w, state, rule, seed is not None), best[0], best[1])
  return best[0], results

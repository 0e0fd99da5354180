"""Where the Mosaic kernel's time goes, per warpgroup, from its own clock.

Runs one fused AdamW (or SGD) update per shape and configuration with Mosaic
GPU's on-device profiler (``kernel_mosaic.profiled``): every warpgroup
records the SM clock at the start and end of each tile's ``token_loop``
(waiting for the x and dY stages, and the wgmma) and ``epilogue`` (the rule
on the accumulator, W and the states loaded and stored). From the trace it
prints, averaged over the CTAs, in thousands of SM clock cycles (kcyc):

* ``period``: the CTA's span divided by its tiles (the time per tile);
* ``token_loop``, ``epilogue``: mean durations of the regions;
* ``overlap``: the share of the epilogues' time during which the CTA's
  other compute warpgroup is in its token loop (ping-pong's point: near
  100% when it works; 0 for the one-warpgroup tiles, where only other
  CTAs on the SM can overlap);
* ``tl_alone``: the share of the period in which one compute warpgroup is
  in its token loop while the other is in neither region (0 for one
  warpgroup per CTA).

For the one-warpgroup tile it also prints how the CTAs resident on one
multiprocessor overlap (:func:`per_sm`: in step or not, and how long the
multiprocessor has no CTA in either region). The profiled kernel runs slower
than the unprofiled one (stop 38: 366 against 290 µs), so the shares are
those of the profiled run.

GPU only::

    python -m experiments.trace_mosaic --shapes 2048:4096x14336 \\
        --modes bf16-sr --rules adamw,sgd --configs default,m128n128t64s3

The trace JSON files stay in ``--dir`` (Perfetto's format, one per call).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench_fused_dw import RULES, _rel_err
from experiments.probe_mosaic import CONFIGS, HP
from pallas_kernels import quantization
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference
from pallas_kernels.fused_dw import kernel_mosaic
from pallas_kernels.fused_dw.api import mosaic_default_config

REGIONS = ("token_loop", "epilogue")


def intervals(trace: dict) -> dict:
  """{(pid, tid): [(name, begin, end), ...]} of a Mosaic GPU profiler trace
  (``traceEvents`` of nested B/E pairs; ``ts``: the warpgroup's start time
  in ns plus the SM cycles since its first event, over 1e3, so differences
  within a warpgroup are thousands of cycles), in time order; a region left
  open (a truncated trace) is dropped.

  Raises:
    ValueError: if an E event has no open B of the same name.
  """
  out = collections.defaultdict(list)
  stacks = collections.defaultdict(list)
  for ev in trace["traceEvents"]:
    if ev.get("ph") not in ("B", "E") or "tid" not in ev:
      continue  # metadata and instant events (Mosaic's own dump has none)
    key = (ev["pid"], ev["tid"])
    if ev["ph"] == "B":
      stacks[key].append((ev["name"], ev["ts"]))
    elif ev["ph"] == "E":
      if not stacks[key] or stacks[key][-1][0] != ev["name"]:
        raise ValueError(f"trace: end of {ev['name']!r} without its begin "
                         f"(pid {ev['pid']}, tid {ev['tid']})")
      name, begin = stacks[key].pop()
      out[key].append((name, begin, ev["ts"]))
  return {k: sorted(v, key=lambda r: r[1]) for k, v in out.items()}


def _overlap(a, b) -> float:
  """Total length of the intersection of two lists of (begin, end)."""
  total = 0.0
  for s0, e0 in a:
    for s1, e1 in b:
      total += max(0.0, min(e0, e1) - max(s0, s1))
  return total


def summarize(trace: dict, traces_per_block: int, compute_wgs: int) -> dict:
  """The per-CTA figures of the module doc, averaged over CTAs (kcyc and
  fractions). ``traces_per_block``: warpgroups per CTA in the trace (3 for
  the two-compute-warpgroup layouts, 1 otherwise); the compute warpgroups
  are the first ``compute_wgs`` of each CTA.

  Raises:
    ValueError: if the trace holds no token_loop region.
  """
  blocks = collections.defaultdict(dict)
  for (pid, tid), rows in intervals(trace).items():
    block, wg = divmod(tid - 1, traces_per_block)
    if wg < compute_wgs:
      blocks[(pid, block)][wg] = rows
  per = collections.defaultdict(list)
  for wgs in blocks.values():
    regions = {wg: {n: [(b, e) for m, b, e in rows if m == n] for n in REGIONS}
               for wg, rows in wgs.items()}
    tiles = sum(len(r["token_loop"]) for r in regions.values())
    if not tiles:
      continue
    begin = min(b for r in regions.values() for n in REGIONS for b, _ in r[n])
    end = max(e for r in regions.values() for n in REGIONS for _, e in r[n])
    per["period"].append((end - begin) / tiles)
    for n in REGIONS:
      lengths = [e - b for r in regions.values() for b, e in r[n]]
      if lengths:
        per[n].append(float(np.mean(lengths)))
    epi = sum(e - b for r in regions.values() for b, e in r["epilogue"])
    if compute_wgs == 2 and len(regions) == 2 and epi > 0:
      ov = (_overlap(regions[0]["epilogue"], regions[1]["token_loop"])
            + _overlap(regions[1]["epilogue"], regions[0]["token_loop"]))
      per["overlap"].append(ov / epi)
      busy = {wg: r["token_loop"] + r["epilogue"] for wg, r in regions.items()}
      alone = 0.0
      for wg in (0, 1):
        mine = regions[wg]["token_loop"]
        alone += (sum(e - b for b, e in mine) - _overlap(mine, busy[1 - wg]))
      per["tl_alone"].append(alone / (end - begin))
    elif compute_wgs == 1:
      per["overlap"].append(0.0)
      per["tl_alone"].append(0.0)
  if not per["period"]:
    raise ValueError("trace: no token_loop region recorded")
  return {k: float(np.mean(v)) for k, v in per.items()} | {
      "ctas": len(per["period"])}


def _union(spans):
  """The (begin, end) list ``spans`` merged into disjoint, sorted spans."""
  out = []
  for b, e in sorted(spans):
    if out and b <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], e))
    else:
      out.append((b, e))
  return out


def cta_regions(trace: dict, clock_ghz: float) -> list:
  """[(pid, [(name, begin, end), ...]), ...]: each CTA's regions of
  :func:`intervals` on one time axis across CTAs, µs, as ``ts0 + (ts - ts0)
  / clock_ghz`` (ts0: the CTA's first event; see :func:`per_sm`)."""
  out = []
  for (pid, _), rows in intervals(trace).items():
    ts0 = rows[0][1]
    out.append((pid, [(n, ts0 + (b - ts0) / clock_ghz, ts0 + (e - ts0) / clock_ghz)
                      for n, b, e in rows]))
  return out


def per_sm(trace: dict, clock_ghz: float) -> dict:
  """How the CTAs that share a multiprocessor overlap (the one-warpgroup
  tile: one CTA per tile, several resident on a multiprocessor at once).

  Mosaic GPU's profiler gives each CTA's events as its start time (the
  global timer, ns) plus SM cycles since its first event; both are in the
  trace's ``ts`` divided by 1e3 and its ``pid`` is 1 + the multiprocessor's
  id. Each CTA's events are put on one time axis as ``ts0 + (ts - ts0) /
  clock_ghz`` (µs; ts0: the CTA's first event), then, per multiprocessor
  and averaged over them:

  * ``sm_epi_under_tl``: the share of the CTAs' epilogue time during which
    another CTA on the same multiprocessor is in its token loop (what two
    resident CTAs out of phase would give; 0 when they run in step);
  * ``sm_tl_under_tl``: the share of token-loop time during which another
    CTA there is in its token loop too (in step);
  * ``sm_idle``: the share of the multiprocessor's span (its first event to
    its last) with no CTA in either region (launches, setup, tails);
  * ``sm_resident``: the mean number of CTAs in a region at once.

  The shares depend on ``clock_ghz`` being the clock the kernel ran at (the
  idle share most). The start times are the global timer's low 32 bits,
  which wrap every 4.3 s; a trace across a wrap is not detected.

  Raises:
    ValueError: if ``clock_ghz`` is not positive or the trace holds no
      token_loop region.
  """
  if not 0 < clock_ghz < float("inf"):
    raise ValueError(f"clock_ghz={clock_ghz!r} must be > 0 and finite")
  sms = collections.defaultdict(list)  # pid -> [{region: [(b, e)]}] per CTA
  for pid, rows in cta_regions(trace, clock_ghz):
    if not any(n == "token_loop" for n, _, _ in rows):
      continue
    sms[pid].append({n: [(b, e) for m, b, e in rows if m == n]
                     for n in REGIONS})
  if not sms:
    raise ValueError("trace: no token_loop region recorded")
  per = collections.defaultdict(list)
  for ctas in sms.values():
    epi = tl = epi_tl = tl_tl = 0.0
    for i, mine in enumerate(ctas):
      others_tl = _union([s for j, c in enumerate(ctas) if j != i
                          for s in c["token_loop"]])
      epi += sum(e - b for b, e in mine["epilogue"])
      tl += sum(e - b for b, e in mine["token_loop"])
      epi_tl += _overlap(mine["epilogue"], others_tl)
      tl_tl += _overlap(mine["token_loop"], others_tl)
    spans = [s for c in ctas for n in REGIONS for s in c[n]]
    span = max(e for _, e in spans) - min(b for b, _ in spans)
    busy = sum(e - b for b, e in _union(spans))
    if epi > 0:
      per["sm_epi_under_tl"].append(epi_tl / epi)
    if tl > 0:
      per["sm_tl_under_tl"].append(tl_tl / tl)
    if span > 0:
      per["sm_idle"].append(1 - busy / span)
      per["sm_resident"].append(sum(e - b for b, e in spans) / span)
  return {k: float(np.mean(v)) for k, v in per.items()} | {"sms": len(sms)}


def regions_reason(cfg, d_in: int, d_out: int, space: int) -> str:
  """Why ``cfg`` cannot be traced here ('' if it can): its layout marks
  no regions (the cooperative two-warpgroup layout, ``early_epilogue``), or
  ``space`` ranges per warpgroup are fewer than its tiles need (two per
  tile, plus one)."""
  if cfg.early_epilogue or (cfg.compute_wgs == 2 and not cfg.ping_pong):
    return ("its layout marks no token_loop/epilogue regions (only the "
            "one-warpgroup layout without early_epilogue and ping-pong do)")
  tiles = -(-d_in // cfg.block_m) * -(-d_out // cfg.block_n)
  per_wg = 1 if cfg.compute_wgs == 1 else -(-tiles // (
      2 * (cfg.num_ctas or kernel_mosaic.num_sms())))
  if 2 * per_wg + 1 > space:
    return f"--space {space} is below the {2 * per_wg + 1} ranges its tiles need"
  return ""


def _inputs(mode: str, rule_name: str, t: int, d_in: int, d_out: int):
  key = jax.random.key(t + d_in)
  x = jax.random.normal(jax.random.fold_in(key, 0), (t, d_in), jnp.bfloat16)
  dy = jax.random.normal(jax.random.fold_in(key, 1), (t, d_out), jnp.bfloat16)
  sr = mode.endswith("-sr")
  dtype = jnp.bfloat16 if mode.startswith("bf16") else jnp.float32
  w = jax.random.normal(jax.random.fold_in(key, 9), (d_in, d_out),
                        jnp.bfloat16 if sr else dtype)
  state = ()
  if rule_name == "adamw":
    mu = (1e-2 * jax.random.normal(jax.random.fold_in(key, 10), (d_in, d_out)))
    nu = mu * mu
    if mode.startswith("int8"):
      state = (quantization.quantize(mu, False), quantization.quantize(nu, True))
    else:
      state = (mu.astype(dtype), nu.astype(dtype))
  return x, dy, w, state, (jnp.uint32(12345) if sr else None)


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--shapes", default="2048:4096x14336", help="T:inxout, ','-separated")
  p.add_argument("--modes", default="bf16-sr",
                 help="fp32, bf16, int8 (fp32 W), bf16-sr, int8-sr (bf16 W "
                 "rounded stochastically), ','-separated")
  p.add_argument("--rules", default="adamw,sgd", help="adamw and/or sgd")
  p.add_argument("--configs", default="default",
                 help="'default' (MosaicConfig.default) and/or probe_mosaic "
                 "names")
  p.add_argument("--space", type=int, default=40,
                 help="profiled ranges per warpgroup (16 bytes of shared "
                 "memory each per warpgroup)")
  p.add_argument("--scalars-at", default="tile",
                 help="kernel_mosaic.SCALARS_AT values to compare: sub, tile "
                 "and/or kernel, ','-separated")
  p.add_argument("--reps", type=int, default=30,
                 help="timed calls per variant (unprofiled, back to back)")
  p.add_argument("--clock-mhz", type=float, default=1980.0,
                 help="SM clock (MHz; nvidia-smi's, 1980 on the H200 unless "
                 "capped) that puts the CTAs resident on one multiprocessor "
                 "on one time axis, for the per-multiprocessor table (in "
                 "step or not, idle; per_sm)")
  p.add_argument("--dir", default=None, help="where the traces go (None: a "
                 "new temporary directory)")
  a = p.parse_args(argv)
  for n in a.configs.split(","):
    if n != "default" and n not in CONFIGS:
      p.error(f"--configs: {n!r} is neither 'default' nor one of {list(CONFIGS)}")
  for r in a.rules.split(","):
    if r not in ("adamw", "sgd"):
      p.error(f"--rules: {r!r} is not adamw or sgd")
  for m in a.modes.split(","):
    if m not in ("fp32", "bf16", "int8", "bf16-sr", "int8-sr"):
      p.error(f"--modes: {m!r} is not fp32, bf16, int8, bf16-sr or int8-sr")
  if a.space < 1:
    p.error("--space must be >= 1")
  if a.reps < 1:
    p.error("--reps must be >= 1")
  if not 0 < a.clock_mhz < float("inf"):
    p.error("--clock-mhz must be > 0 and finite")
  for v in a.scalars_at.split(","):
    if v not in ("sub", "tile", "kernel"):
      p.error(f"--scalars-at: {v!r} is not sub, tile or kernel")
  shapes = []
  for spec in a.shapes.split(","):
    try:
      t, dims = spec.split(":")
      shapes.append((int(t), *map(int, dims.split("x"))))
      assert len(shapes[-1]) == 3 and min(shapes[-1]) > 0
    except (ValueError, AssertionError):
      p.error(f"--shapes: {spec!r} is not T:inxout with positive integers")
  if jax.devices()[0].platform != "gpu":
    p.error("the on-device profiler needs a GPU")
  root = a.dir or tempfile.mkdtemp(prefix="trace_mosaic_")
  print(jax.__version__, jax.devices()[0].device_kind, "traces in", root, flush=True)
  rows = []
  for t, d_in, d_out in shapes:
    for mode in a.modes.split(","):
      for rule_name in a.rules.split(","):
        if rule_name == "sgd" and mode.startswith("int8"):
          continue
        rule = RULES[rule_name]
        x, dy, w, state, seed = _inputs(mode, rule_name, t, d_in, d_out)
        hp = rule.pack({n: HP[n] for n in rule.hyperparam_names}, 7)
        ref = jax.jit(lambda x, dy, w, st, hp, seed, rule=rule:
                      fused_dw_update_reference(x, dy, w, st, hp, rule=rule,
                                                seed=seed))
        ref_w, ref_state = ref(x, dy, w, state, hp, seed)
        want = [ref_w, *ref_state]
        for name in a.configs.split(","):
          cfg = (mosaic_default_config(x, dy, w, state, rule, seed)
                 if name == "default" else CONFIGS[name])
          reason = regions_reason(cfg, d_in, d_out, a.space)
          if reason:
            print(f"T={t} {d_in}x{d_out} {mode} {rule_name} {name}: SKIPPED, "
                  f"{reason}", flush=True)
            continue
          for where in a.scalars_at.split(","):
            label = f"T={t} {d_in}x{d_out} {mode} {rule_name} {name} {where}"
            try:
              s = _run(x, dy, w, state, hp, seed, rule, cfg, where, a, root,
                       label, want)
              rows.append((label, s))
              print(label, {k: round(v, 4) for k, v in s.items()}, flush=True)
            except Exception as e:  # noqa: BLE001 -- reported, the sweep goes on
              print(f"{label}: ERROR {type(e).__name__}: {str(e)[:400]}",
                    flush=True)
  print("\n| shape, mode, rule, config, scalars read | ms | err | CTAs | period "
        "kcyc/tile | token_loop kcyc | epilogue kcyc | overlap | tl_alone |\n"
        "|---|---|---|---|---|---|---|---|---|")
  for label, s in rows:
    print(f"| {label} | {s['ms']:.3f} | {s['err']:.1e} | {s['ctas']} "
          f"| {s['period']:.2f} | {s['token_loop']:.2f} "
          f"| {s.get('epilogue', float('nan')):.2f} "
          f"| {s.get('overlap', float('nan')):.0%} "
          f"| {s.get('tl_alone', float('nan')):.0%} |")
  sm_rows = [(label, s) for label, s in rows if "sms" in s]
  if sm_rows:
    print("\nCTAs sharing a multiprocessor (one-warpgroup tiles; per_sm):\n"
          "| shape, mode, rule, config, scalars read | multiprocessors | "
          "epilogue under another's token loop | token loop under another's "
          "| idle | CTAs in a region |\n|---|---|---|---|---|---|")
    for label, s in sm_rows:
      print(f"| {label} | {s['sms']} | {s['sm_epi_under_tl']:.0%} "
            f"| {s['sm_tl_under_tl']:.0%} | {s['sm_idle']:.0%} "
            f"| {s['sm_resident']:.2f} |")
  return rows


def _run(x, dy, w, state, hp, seed, rule, cfg, where, a, root, label, want):
  """One variant: its error against the reference, its time unprofiled
  (ms per call, ``a.reps`` calls back to back) and its trace's summary."""
  old = kernel_mosaic.SCALARS_AT
  kernel_mosaic.SCALARS_AT = where
  # The kernel's own jit caches its lowering by shape and config alone: each
  # variant (and the profiled build, which must not be timed) starts afresh.
  jax.clear_caches()
  try:
    def make():
      return jax.jit(lambda x, dy, w, st, hp, seed: fused_dw_update(
          x, dy, w, st, hp, rule=rule, implementation="mosaic", config=cfg,
          seed=seed))
    fn = make()
    new_w, new_state = fn(x, dy, w, state, hp, seed)
    err = _rel_err([new_w, *new_state], want)
    jax.block_until_ready(fn(x, dy, w, state, hp, seed))
    t0 = time.perf_counter()
    for _ in range(a.reps):
      out = fn(x, dy, w, state, hp, seed)
    jax.block_until_ready(out)
    ms = (time.perf_counter() - t0) / a.reps * 1e3
    out_dir = os.path.join(root, re.sub(r"[^A-Za-z0-9_.-]+", "_", label))
    os.makedirs(out_dir, exist_ok=True)
    for old_trace in glob.glob(os.path.join(out_dir, "*-trace.json")):
      os.remove(old_trace)  # a run that writes none must not read a stale one
    jax.clear_caches()
    with kernel_mosaic.profiled(out_dir, a.space):
      prof = make()
      for _ in range(2):  # the last call's trace is read
        jax.block_until_ready(prof(x, dy, w, state, hp, seed))
  finally:
    kernel_mosaic.SCALARS_AT = old
    jax.clear_caches()
  files = sorted(glob.glob(os.path.join(out_dir, "*-trace.json")))
  with open(files[-1]) as f:
    trace = json.load(f)
  s = summarize(trace, 3 if cfg.compute_wgs == 2 else 1, cfg.compute_wgs)
  if cfg.compute_wgs == 1:
    s |= per_sm(trace, a.clock_mhz / 1e3)
  return {"ms": ms, "err": err, **s}


if __name__ == "__main__":
  main()

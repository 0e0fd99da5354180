"""Fused dW + optimizer kernel against XLA, per optimizer and precision mode.

For each linear shape (T tokens, in -> out) and each (optimizer, mode) pair it
first checks the fused kernel against the reference on the same inputs, then
times it, inputs rotated over three buffers, W and state donated and fed back.
``--timing chain`` (the default) times the ops as a training step runs them:
``--chain`` ops applied one after the other inside one jitted call (an
``optimization_barrier`` between two, so that XLA neither merges the
unfused updates nor reuses a repeated dW; each op has its own
stochastic-rounding seed, as each training step has), calls dispatched back
to back after a warm-up; the time per op is the median over ``--rounds``
rounds of ``--reps`` ops. The check then compares the whole chain's result
with the unfused chain's, at a learning rate (``CHECK_LEARNING_RATE``) at
which one stale or dropped update fails it. ``--timing call`` times one op
per jitted call (mean of
``--reps`` calls dispatched back to back), so a short op also carries the
host's dispatch of its call (stops 14 to 23 measured this way). The variants:

* ``xla dW``: dW = xᵀ·dY alone (bf16 operands, fp32 result), once per shape;
* ``unfused``: XLA dW, then the same rule on the whole array, jitted with W
  and state donated (the unfused baseline, the same storage formats); dW
  in fp32, or the matmul's result in bf16 with ``--unfused-grad-dtype
  bfloat16``, as an unfused step with bf16 params (optax's) keeps it
  (stop 40: in the 8B model that step's dW and update took about 35.9 ms,
  near their floors, by the difference of two profiles);
* ``fused``: the Pallas Triton kernel (default tile configuration);
* ``mosaic`` (``--mosaic``): the Pallas Mosaic GPU kernel (TMA + wgmma,
  ``mosaic_default_config``), where the case is in its scope (else the reason);
* ``torch`` (``--torch``, AdamW with fp32 states only): PyTorch's dW then
  ``torch.optim.AdamW(fused=True)``; with ``--timing chain`` ``--chain``
  steps captured in one CUDA graph and replayed (eager steps if the capture
  fails; the JSON says which), else eager steps;

beside the floor max(2·T·in·out / peak FLOP/s, bytes that must move / peak
bandwidth). The floor uses the H200's nominal peaks (790 TFLOP/s dense bf16,
4.3 TB/s; ``--peaks`` to change them); the peaks measured in the same run (a
bf16 matmul and a donated fp32 elementwise pass) are printed and saved beside
them, and so is each case's achieved TFLOP/s and GB/s. (A measured matmul
peak alone is no floor: XLA's dW itself ran faster than the square bf16
matmul in earlier runs, 776 against 530-680 TFLOP/s.) The bytes that must move are x and dY once (bf16) plus
W and every state read and written in their storage formats.

Modes (AdamW's names; each optimizer stores its own states this way):

* ``fp32``: fp32 W, fp32 states;
* ``bf16-sr``: bf16 W written with stochastic rounding, fp32 states;
* ``bf16-sr-bf16``: bf16 W with stochastic rounding, bf16 states;
* ``int8``: bf16 W with stochastic rounding, int8 states (absmax blocks of 64).

    python -m experiments.bench_fused_dw                       # 8B MLP, T=2048
    python -m experiments.bench_fused_dw --shapes models --rules adamw \
        --modes fp32,bf16-sr,int8 --autotune --torch           # the full sweep
    python -m experiments.bench_fused_dw --rules adamw --modes fp32 \\
        --shapes 8192:4096x14336

Prints one markdown table (last) and writes JSON to ``--out``;
``--table-from FILE [--peaks 790e12,4.3e12]`` reprints an earlier run's table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import time
import traceback

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from experiments import _runs
from forge_jax._src.fold import FoldAdamRule
from forge_jax.rules import ALL_RULES
from pallas_kernels import quantization
from pallas_kernels.fused_dw import autotune
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference
from pallas_kernels.fused_dw import weight_grad_reference

RULES = {r.name: r for r in ALL_RULES}
UNFUSED_GRAD_DTYPES = {"xla": jnp.float32, "xla-bf16dW": jnp.bfloat16}
"""The unfused steps (names as in ``bench_case`` and ``probe_mosaic``) and
the dtype of their dW (``fused_dw_update_reference``'s ``grad_dtype``)."""
# FOAM inside the kernel (folded moments, 2**l times smaller): opt-in names.
FOLD_RULES = {r.name: r for r in (FoldAdamRule(2), FoldAdamRule(3), FoldAdamRule(4))}
# mode -> (W dtype, state storage dtype, stochastic rounding)
NOMINAL_PEAKS = "790e12,4.3e12"
"""H200 dense bf16 matmul FLOP/s and HBM bytes/s used for the floor."""
MODES = {
    "fp32": (jnp.float32, jnp.float32, False),
    "bf16-sr": (jnp.bfloat16, jnp.float32, True),
    "bf16-sr-bf16": (jnp.bfloat16, jnp.bfloat16, True),
    "int8": (jnp.bfloat16, jnp.int8, True),
}
# (in, out) of every linear layer of Llama-3.1-8B and Qwen3-14B: q/o, k/v
# (GQA), gate/up, down.
MODEL_SHAPES = ("4096x4096", "4096x1024", "4096x14336", "14336x4096",
                "5120x5120", "5120x1024", "5120x17408", "17408x5120")
MAX_REL_ERR = 1e-4
"""A kernel result (one op) further than this from the reference is not
timed."""
CHAIN_MAX_REL_ERR = 1e-3
"""The same for the result of a chain of ops (``--timing chain``), against
the unfused chain's: int8 moments drift apart by a code here and there over
several steps (2.1e-4 after 9 steps in interpret mode on jax 0.10.2, where
a square root is x·rsqrt(x)). The check runs at ``CHECK_LEARNING_RATE``, so
that an op that reads a stale W or drops one update is off by about 1e-2
(AdamW, 64×128, interpret mode: 9.6e-3 in fp32; at 1e-2, 4.8e-3 in fp32,
5.4e-3 with bf16 or int8 states; at the timed 1e-3 it was 4.8e-4 and
passed)."""
CHECK_LEARNING_RATE = 2e-2
"""The learning rate of the correctness check (the timed ops run at
``HYPERPARAMS``'s 1e-3): an AdamW update then moves W by about 2% of its
norm, so that one update's worth of error is ten times the chain's
tolerance (the relative error is over the whole result, W's norm
included)."""
HYPERPARAMS = {"learning_rate": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
               "threshold": 5.0, "weight_decay": 0.01, "decay": 0.9,
               "momentum": 0.9, "eps_root": 0.0, "scale": 0.25}


def _time(fn, args_list, reps: int) -> float:
  """Mean seconds of a stateless fn over rotating argument sets.

  The calls are dispatched back to back and waited for once, so the device
  runs them without gaps (as in training) and the host's dispatch time is
  hidden unless a call is shorter than it. Outputs are not accumulated
  (``reps`` live outputs would time the allocator when preallocation is
  off).
  """
  jax.block_until_ready(fn(*args_list[0]))
  t0 = time.perf_counter()
  for i in range(reps):  # only the last output is kept: each is freed when
    out = fn(*args_list[i % len(args_list)])  # replaced (after its kernel)
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / reps


BARRIERS = ("all", "state")
"""What :func:`chained` puts behind each op's ``optimization_barrier``:
``all``, (x, dY, carry, rest); ``state``, (carry, rest) only, x and dY
reaching the op directly (no set may then repeat within a chain)."""


def _check_barrier(barrier: str) -> None:
  if barrier not in BARRIERS:
    raise ValueError(f"barrier={barrier!r}: expected one of {BARRIERS}")


def _check_no_repeat(barrier: str, chain: int, sets) -> None:
  """With x and dY outside the barriers, a set used twice in one chain could
  have its dW computed once: refused."""
  if barrier == "state" and chain > len(sets):
    raise ValueError(f"barrier='state' with chain={chain} > {len(sets)} "
                     "sets: a set would repeat, and XLA could compute its "
                     "dW once")


def chained(step, chain: int, per_op=None, barrier: str = "all"):
  """jit of ``chain`` applications of ``carry = step(x, dy, *carry,
  *rest_i)`` (``run(sets, carry, rest)``, carry donated), the i-th on
  ``sets[i % len(sets)]`` with ``rest_i = per_op(rest, i)`` (default
  ``rest``). An ``optimization_barrier`` before each op keeps XLA from
  merging consecutive ops (fusing the elementwise updates of several steps
  into one pass) and from computing anything twice-used once (what depends
  on ``rest`` only, such as stochastic-rounding bits; with ``barrier='all'``
  also a repeated set's dW). ``barrier``: one of :data:`BARRIERS`; with
  ``'state'`` the call raises ValueError if ``chain`` exceeds the sets
  given (a repeated set's dW could be computed once)."""
  _check_barrier(barrier)

  def run(sets, carry, rest):
    _check_no_repeat(barrier, chain, sets)
    carry = tuple(carry)
    for i in range(chain):
      x, dy = sets[i % len(sets)]
      if barrier == "all":
        x, dy, carry, rest_i = lax.optimization_barrier(
            (x, dy, carry, tuple(rest)))
      else:
        carry, rest_i = lax.optimization_barrier((carry, tuple(rest)))
      if per_op is not None:
        rest_i = per_op(rest_i, i)
      carry = tuple(step(x, dy, *carry, *rest_i))
    return carry
  return jax.jit(run, donate_argnums=1)


def own_seed(rest, i):
  """``per_op`` of :func:`chained` for a step whose ``rest`` is (hparams,
  seed): op i rounds with seed + i, as each training step has its own."""
  return rest[0], rest[1] + jnp.uint32(i)


def step_args(args, n_flat: int):
  """(W and the states, hparams, seed or None) of a step's arguments after
  x and dY: the ``n_flat`` arrays, then the hyperparameters, then the
  stochastic-rounding seed if there is one."""
  flat, (hp, *seed) = args[:n_flat], args[n_flat:]
  return flat, hp, seed[0] if seed else None


def _dw_chain(chain: int, barrier: str = "all"):
  """jit of ``chain`` XLA dWs on rotating sets (``run(sets, (), ())``), all
  returned (an unused dW would be dropped). ``barrier='all'``: each dW's x
  and dY behind a barrier with the previous dW; ``'state'``: nothing ties
  them (the dWs are independent; XLA may order them as it likes), and a set
  may not repeat (ValueError)."""
  _check_barrier(barrier)

  def run(sets, carry, rest):
    del carry, rest
    _check_no_repeat(barrier, chain, sets)
    outs, prev = [], ()
    for i in range(chain):
      x, dy = sets[i % len(sets)]
      if barrier == "all":
        x, dy, prev = lax.optimization_barrier((x, dy, prev))
      prev = weight_grad_reference(x, dy)
      outs.append(prev)
    return tuple(outs)
  return jax.jit(run)


def _time_chained(run, sets, carry, rest, reps: int, chain: int,
                  rounds: int = 3, feed_back: bool = True) -> float:
  """Median over ``rounds`` of the seconds per op of ``run`` (a
  :func:`chained` function of ``chain`` ops), each round ceil(reps / chain)
  calls dispatched back to back (after one warm-up call) and waited for
  once. ``feed_back``: each call's result is the next call's carry (else
  the carry stays and the result is dropped when the next one arrives)."""
  calls = max(1, -(-reps // chain))
  # A tuple, as the results fed back are: a list would compile again.
  carry, rest = tuple(carry), tuple(rest)
  out = jax.block_until_ready(run(sets, carry, rest))
  per_op = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    for _ in range(calls):
      if feed_back:
        carry = out
      out = run(sets, carry, rest)
    jax.block_until_ready(out)
    per_op.append((time.perf_counter() - t0) / (calls * chain))
  return float(np.median(per_op))


def _time_stateful(fn, sets, carry, rest, reps: int) -> float:
  """Mean seconds of ``carry = fn(x, dy, *carry, *rest)`` (carry donated),
  dispatched back to back as in :func:`_time`."""
  carry = fn(*sets[0], *carry, *rest)
  jax.block_until_ready(carry)
  t0 = time.perf_counter()
  for i in range(reps):
    x, dy = sets[i % len(sets)]
    carry = fn(x, dy, *carry, *rest)
  jax.block_until_ready(carry)
  return (time.perf_counter() - t0) / reps


def measure_peaks(n: int = 8192, reps: int = 20) -> tuple[float, float]:
  """(bf16 n×n×n matmul FLOP/s, bytes/s of an fp32 pass over 16·n²) here."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  t = _time(jax.jit(lambda a, b: a @ b), [(a, b)], reps)
  flops = 2 * n**3 / t
  # The pass donates its input and is chained, so no output is kept alive
  # (keeping ``reps`` 4 GiB outputs, as _time would, measures the allocator
  # when XLA_PYTHON_CLIENT_PREALLOCATE=false: 0.09 TB/s on the H200).
  x = jax.random.normal(jax.random.key(2), (16 * n * n,), jnp.float32)
  size = x.size
  scale = jax.jit(lambda x: x * 1.0000001, donate_argnums=0)
  x = jax.block_until_ready(scale(x))
  t0 = time.perf_counter()
  for _ in range(reps):
    x = scale(x)
  jax.block_until_ready(x)
  t = (time.perf_counter() - t0) / reps
  return flops, 2 * size * 4 / t


def _storage_bytes(n: int, dtype) -> float:
  if jnp.dtype(dtype) == jnp.int8:
    return n * (1 + 4 / quantization.BLOCK_SIZE)
  return n * jnp.dtype(dtype).itemsize


def _flat(w, state):
  return [w] + [a for s in state for a in jax.tree.leaves(s)]


def _unflat(flat, like_state):
  w, rest, out = flat[0], list(flat[1:]), []
  for s in like_state:
    n = len(jax.tree.leaves(s))
    out.append(jax.tree.unflatten(jax.tree.structure(s), rest[:n]))
    rest = rest[n:]
  return w, tuple(out)


def _rel_err(got, want) -> float:
  def f32(a):
    if isinstance(a, quantization.QuantizedArray):
      return np.asarray(quantization.dequantize(a), np.float64)
    return np.asarray(a.astype(jnp.float32), np.float64)
  errs = []
  for g, w in zip(got, want):
    g, w = f32(g), f32(w)
    errs.append(float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)))
  return max(errs)


def torch_adamw_seconds(t: int, d_in: int, d_out: int, reps: int,
                        chain: int = 0, rounds: int = 3):
  """PyTorch's step: dW = dYᵀ·x (bf16 GEMM, fp32 grad), then
  ``torch.optim.AdamW(fused=True)`` on an fp32 weight; inputs rotated over
  three sets. ``chain`` > 0: ``chain`` steps captured in one CUDA graph
  (``capturable=True``) and replayed, the median over ``rounds`` of
  ceil(reps / chain) replays per step (no host time per step, as the JAX
  chains); if the capture fails, eager steps. ``chain`` = 0: eager steps
  (the mean of ``reps``). Returns (seconds per step, 'cuda graph' or
  'eager'), or None without torch or CUDA."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  if not torch.cuda.is_available():
    return None
  gen = torch.Generator(device="cuda").manual_seed(0)
  xs = [torch.randn(t, d_in, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)]
  dys = [torch.randn(t, d_out, device="cuda", dtype=torch.bfloat16, generator=gen)
         for _ in range(3)]

  def setup(capturable):
    w = torch.nn.Parameter(torch.randn(d_out, d_in, device="cuda", generator=gen))
    w.grad = torch.zeros_like(w)
    opt = torch.optim.AdamW([w], lr=1e-3, weight_decay=0.01, fused=True,
                            capturable=capturable)

    def step(i):  # the grad's fp32 copy is the .float() of the bf16 GEMM
      w.grad.copy_(dys[i % 3].t() @ xs[i % 3])
      opt.step()
    return step

  def eager():
    step = setup(False)
    for i in range(3):
      step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
      step(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps, "eager"

  def graphed():
    step = setup(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
      for i in range(3):
        step(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: other threads' CUDA calls (JAX's) do not void the capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
      for i in range(chain):
        step(i)
    graph.replay()
    torch.cuda.synchronize()
    calls, per_step = max(1, -(-reps // chain)), []
    for _ in range(rounds):
      t0 = time.perf_counter()
      for _ in range(calls):
        graph.replay()
      torch.cuda.synchronize()
      per_step.append((time.perf_counter() - t0) / (calls * chain))
    return float(np.median(per_step)), "cuda graph"

  try:
    if chain:
      try:
        return graphed()
      except Exception:  # noqa: BLE001  reported as the timing used
        traceback.print_exc()
    return eager()
  finally:
    del xs, dys
    torch.cuda.empty_cache()


def bench_case(rule, mode, t, d_in, d_out, sets, reps, rng, interpret=False,
               tune=False, mosaic=False, chain=0, rounds=3, triton=True,
               barrier="all", unfused_grad_dtype="float32"):
  """One (rule, mode, shape): checked, then unfused and fused timed; ``chain``
  > 0 times :func:`chained` ops (and checks the chain; ``barrier`` as
  :func:`chained`'s), 0 one op per call.
  ``triton=False`` leaves the Triton kernel out (no ``fused_s``).
  ``unfused_grad_dtype``: the dtype of the timed unfused step's dW
  (``fused_dw_update_reference``'s ``grad_dtype``); the kernels are checked
  against the fp32 one either way."""
  if unfused_grad_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"unfused_grad_dtype={unfused_grad_dtype!r} must be "
                     "'float32' or 'bfloat16'")
  w_dtype, state_dtype, sr = MODES[mode]
  hp = rule.pack({n: HYPERPARAMS[n] for n in rule.hyperparam_names}, 7)
  check = dict(HYPERPARAMS, learning_rate=CHECK_LEARNING_RATE)
  hp_check = rule.pack({n: check[n] for n in rule.hyperparam_names}, 7)
  # The stochastic-rounding seed is an argument (a chain gives each op its
  # own, as training gives each step), after the hyperparameters.
  seeds = [jnp.uint32(1234)] if sr else []
  rest, rest_check = [hp, *seeds], [hp_check, *seeds]

  key = jax.random.key(int(rng.integers(2**31)))

  def fresh():
    w = jax.random.normal(jax.random.fold_in(key, 0), (d_in, d_out), w_dtype)
    state = []
    for i, name in enumerate(rule.state_names):
      v = 1e-2 * jax.random.normal(jax.random.fold_in(key, i + 1),
                                   rule.state_shape((d_in, d_out)), jnp.float32)
      nonneg = name in rule.nonnegative_states
      if nonneg:
        v = v * v
      state.append(quantization.quantize(v, nonneg)
                   if jnp.dtype(state_dtype) == jnp.int8 else v.astype(state_dtype))
    return w, tuple(state)

  w, state = fresh()
  like = state

  n_flat = 1 + sum(len(jax.tree.leaves(s)) for s in like)

  def make_step(impl):
    def step(x, dy, *args):
      flat, hp_, seed = step_args(args, n_flat)
      w_, st = _unflat(flat, like)
      # in_place: the op's result replaces its donated arguments (whole
      # arrays, nothing sliced: one op per jitted call, or ops chained
      # through barriers, which the chain's check covers), as ForgeDense
      # runs an unstacked layer.
      nw, ns = (fused_dw_update(x, dy, w_, st, hp_, rule=rule, seed=seed,
                                implementation=impl, interpret=interpret,
                                in_place=True)
                if impl in ("triton", "mosaic")
                else fused_dw_update_reference(
                    x, dy, w_, st, hp_, rule=rule, seed=seed,
                    grad_dtype=UNFUSED_GRAD_DTYPES[impl]))
      return tuple(_flat(nw, ns))
    return step

  make = lambda impl: _Variant(make_step(impl), n_flat, sets, reps, chain,  # noqa: E731
                               rounds, own_seed if sr else None, barrier)

  unfused = make("xla")
  if tune:  # records the fastest tile in the cache; `fused` then uses it
    autotune.autotune(*sets[0], w, state, hp, rule=rule,
                      seed=seeds[0] if sr else None,
                      interpret=interpret, reps=max(5, reps // 3))
  copy = lambda: [jnp.copy(a) for a in _flat(w, state)]  # noqa: E731
  want = unfused.results(copy, rest_check)
  if unfused_grad_dtype == "bfloat16":
    unfused = make("xla-bf16dW")
  t_unfused = unfused.seconds(copy(), rest)
  extra = {}
  if triton:
    fused = make("triton")
    extra.update(rel_err=fused.error(copy, rest_check, want),
                 fused_s=fused.seconds(copy(), rest))
  if mosaic:
    extra.update(_mosaic_case(make("mosaic"), copy, rest, rest_check, want))
  n = d_in * d_out
  n_state = int(np.prod(rule.state_shape((d_in, d_out))))
  moved = (2 * t * (d_in + d_out) + 2 * _storage_bytes(n, w_dtype)
           + 2 * len(rule.state_names) * _storage_bytes(n_state, state_dtype))
  return dict(rule=rule.name, mode=mode, unfused_s=t_unfused, bytes=moved,
              unfused_grad_dtype=unfused_grad_dtype, **extra)


class _Variant:
  """One implementation's timed function: one op per jitted call (W and
  state donated; ``chain`` = 0) or ``chain`` ops in one (:func:`chained`)."""

  def __init__(self, step, n_flat, sets, reps, chain, rounds, per_op=None,
               barrier="all"):
    self.chained = chained(step, chain, per_op, barrier) if chain else None
    self.single = (None if chain else
                   jax.jit(step, donate_argnums=tuple(range(2, 2 + n_flat))))
    self.sets, self.reps, self.chain, self.rounds = sets, reps, chain, rounds

  def results(self, copy, rest):
    """The whole chain's result from ``copy()``, or one op's on the first
    set; ``rest``: the step's arguments after W and the states."""
    if self.chained:
      return list(self.chained(self.sets, tuple(copy()), tuple(rest)))
    return list(self.single(*self.sets[0], *copy(), *rest))

  def error(self, copy, rest, want):
    """Relative error against ``want`` (the reference's :meth:`results`)."""
    return _rel_err(self.results(copy, rest), want)

  @property
  def max_rel_err(self) -> float:
    return CHAIN_MAX_REL_ERR if self.chained else MAX_REL_ERR

  def seconds(self, flat, rest):
    if self.chained:
      return _time_chained(self.chained, self.sets, flat, rest, self.reps,
                           self.chain, self.rounds)
    return _time_stateful(self.single, self.sets, flat, list(rest), self.reps)


def _mosaic_case(mosaic, copy, rest, rest_check, want) -> dict:
  """The Mosaic kernel's columns of one case: its relative error and time,
  or why it has none: outside its scope (the API's refusal, which names
  the reason), a failure to build or run (reported with its type and first
  line, the other variants' columns kept; the traceback is printed), or a
  result that differs from the reference (reported, not timed)."""
  scope = "implementation='mosaic': "
  try:
    err = mosaic.error(copy, rest_check, want)
    if not err <= mosaic.max_rel_err:
      what = (f"its chain of {mosaic.chain} differs from the unfused chain"
              if mosaic.chain else "differs from the reference")
      return dict(mosaic_rel_err=err,
                  mosaic_error=f"{what}: rel err {err:.1e}")
    return dict(mosaic_rel_err=err, mosaic_s=mosaic.seconds(copy(), rest))
  except ValueError as e:
    if str(e).startswith(scope):
      return dict(mosaic_error=str(e)[len(scope):][:120])
    failure = e
  except Exception as e:  # noqa: BLE001  a failure is a result of the run too
    failure = e
  traceback.print_exception(failure)
  first = (str(failure).strip().splitlines() or [""])[0]
  return dict(mosaic_error=f"failed: {type(failure).__name__}: {first[:160]}")


def _log_peaks(path: str):
  """(FLOP/s, bytes/s) from a bench log's "measured peaks: X TFLOP/s ...,
  Y TB/s" line, or None."""
  with open(path) as f:
    for line in f:
      m = re.match(r"measured peaks: ([\d.]+) TFLOP/s .*?, ([\d.]+) TB/s", line)
      if m:
        return float(m.group(1)) * 1e12, float(m.group(2)) * 1e12
  return None


def sm_clock_mhz() -> int | None:
  """The first GPU's SM clock now (nvidia-smi), or None where there is none
  (a clock well under the H200's 1980 MHz boost marks a throttled run)."""
  try:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=10, check=True).stdout
    return int(out.split()[0])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    return None


def floor_s(t: int, d_in: int, d_out: int, moved: float, flops_peak: float,
            bw_peak: float) -> float:
  """The op's floor in seconds: max(2·T·in·out / FLOP/s, bytes that must
  move / bytes/s)."""
  return max(2 * t * d_in * d_out / flops_peak, moved / bw_peak)


def _parse_peaks(text: str) -> tuple[float, float]:
  try:
    flops, bw = (float(v) for v in text.split(","))
  except ValueError:
    flops = bw = float("nan")
  if not (0 < flops < float("inf") and 0 < bw < float("inf")):
    raise SystemExit(f"--peaks: expected FLOPS,BYTES_PER_S, both positive and "
                     f"finite (e.g. {NOMINAL_PEAKS}), or 'measured'; got {text!r}")
  return flops, bw


def _kernel_s(r):
  """(kernel, seconds) of a row's summary columns: Mosaic where it was
  timed, else Triton; (None, None) if neither was."""
  if r.get("mosaic_s"):
    return "mosaic", r["mosaic_s"]
  if r.get("fused_s"):
    return "triton", r["fused_s"]
  return None, None


def _timing_line(rows) -> str:
  """How ``rows`` were timed, as the tables' "timing:" line says it."""
  timing = rows[0].get("timing", "call") if rows else "call"
  torch_timing = ", ".join(sorted({r["torch_timing"] for r in rows
                                   if r.get("torch_timing")}))
  how = (f"{rows[0]['chain']} ops chained in one jitted call, median of rounds"
         + (", x and dY outside the barriers"
            if rows[0].get("barrier") == "state" else "")
         if timing == "chain" else "one op per jitted call")
  grads = sorted({r.get("unfused_grad_dtype", "float32") for r in rows})
  return (f"timing: {how}" + (f"; torch: {torch_timing}" if torch_timing else "")
          + f"; unfused dW: {', '.join(grads) or 'float32'}")


def print_table_by_shape(rows, flops_peak: float, bw_peak: float) -> None:
  """One line per (T, in→out, rule) with the modes side by side: floor,
  unfused, the kernel of :func:`print_table`'s summary columns, kernel vs
  unfused, % of floor and the SM clock, each "a / b / c" over the modes of
  the header (every mode any row has, in the rows' order); torch where the
  rule is AdamW and the row has it (fp32 only). A mode with no row for a
  shape, an error row, or no kernel time shows "—" in its place."""
  modes = list(dict.fromkeys(r["mode"] for r in rows))
  groups = {}
  for r in rows:
    groups.setdefault((*r["shape"], r["rule"]), {})[r["mode"]] = r
  if not groups:
    return
  print(f"\nby shape ({' / '.join(modes)}); floors from {flops_peak / 1e12:.0f} "
        f"TFLOP/s, {bw_peak / 1e12:.2f} TB/s")
  print(_timing_line(rows))
  print("| T | in→out | optimizer | floor ms | unfused ms | torch ms | kernel ms | "
        "vs unfused | % of floor | sm MHz |")
  print("|---" * 10 + "|")
  ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
  for (t, d_in, d_out, rule), by_mode in groups.items():
    cols = [[] for _ in range(6)]
    torch_s = None
    for mode in modes:
      r = by_mode.get(mode)
      if r is None or "error" in r:
        for c in cols:
          c.append("—")
        continue
      if r.get("torch_adamw_s") and (rule, mode) == ("adamw", "fp32"):
        torch_s = r["torch_adamw_s"]
      floor = floor_s(t, d_in, d_out, r["bytes"], flops_peak, bw_peak)
      k = _kernel_s(r)[1]
      cols[0].append(ms(floor))
      cols[1].append(ms(r["unfused_s"]))
      cols[2].append(ms(k) if k else "—")
      cols[3].append(f"{r['unfused_s'] / k:.2f}x" if k else "—")
      cols[4].append(f"{floor / k * 100:.0f}%" if k else "—")
      cols[5].append(str(r.get("sm_clock_mhz") or "?"))
    cells = [cols[0], cols[1], [ms(torch_s) if torch_s else ""], *cols[2:]]
    print(f"| {t} | {d_in}→{d_out} | {rule} | "
          + " | ".join(" / ".join(c) for c in cells) + " |")


def print_table(rows, flops_peak: float, bw_peak: float, source: str) -> None:
  """The markdown table of ``rows``, floors from the given peaks.

  Triton and Mosaic are the two Pallas kernels' times (each checked first;
  an error or refusal is shown in its place). The columns after them are
  for the Mosaic kernel where it was timed, else Triton ("kernel"): the one
  ``implementation='auto'`` runs on the H200 (jax >= 0.11), except for
  folded moments with a bf16 W, which 'auto' keeps on Triton. "% of floor" is floor
  / its time (100% = at the floor); TFLOP/s and GB/s are its achieved rates
  (2·T·in·out and the bytes that must move, over its time); "xla dW (fp32) TFLOP/s"
  is XLA's dW alone. "sm MHz" is the SM clock nvidia-smi read right after
  the case was timed, where it could (not during the timing).
  """
  print(f"\nfloor peaks ({source}): {flops_peak / 1e12:.0f} TFLOP/s (bf16 "
        f"matmul), {bw_peak / 1e12:.2f} TB/s")
  print(_timing_line(rows))
  print("| T | in→out | optimizer | mode | floor ms | xla dW (fp32) ms | unfused ms | "
        "torch AdamW ms | Triton ms | Mosaic ms | kernel | % of floor | "
        "vs unfused | vs torch | TFLOP/s | GB/s | xla dW (fp32) TFLOP/s | sm MHz |")
  print("|---" * 18 + "|")
  ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
  for r in rows:
    t, d_in, d_out = r["shape"]
    head = f"| {t} | {d_in}→{d_out} | {r['rule']} | {r['mode']} |"
    if "error" in r:
      print(head + " |" * 13 + f" {r['error']} |")
      continue
    floor = floor_s(t, d_in, d_out, r["bytes"], flops_peak, bw_peak)
    torch_s = r["torch_adamw_s"] if (r["rule"], r["mode"]) == ("adamw", "fp32") else None
    cells = {}
    for name, key in (("triton", "fused"), ("mosaic", "mosaic")):
      if r.get(f"{key}_s"):
        cells[name] = f"{ms(r[f'{key}_s'])} (err {r[f'{key}_rel_err' if key == 'mosaic' else 'rel_err']:.1e})"
      else:
        cells[name] = f"({r[f'{key}_error']})" if r.get(f"{key}_error") else ""
    kernel, k_s = _kernel_s(r)
    if kernel:
      summary = (f"{kernel} | {100 * floor / k_s:.0f}% | {r['unfused_s'] / k_s:.2f}x | "
                 + (f"{torch_s / k_s:.2f}x" if torch_s else "") + " | "
                 f"{2 * t * d_in * d_out / k_s / 1e12:.0f} | {r['bytes'] / k_s / 1e9:.0f}")
    else:
      summary = " | " * 5
    print(f"{head} {ms(floor)} | {ms(r['xla_dw_s'])} | {ms(r['unfused_s'])} | "
          f"{ms(torch_s) if torch_s else ''} | {cells['triton']} | {cells['mosaic']} | "
          f"{summary} | {2 * t * d_in * d_out / r['xla_dw_s'] / 1e12:.0f} | "
          f"{r.get('sm_clock_mhz') or ''} |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="2048:4096x14336",
                 help="T:inxout, several separated by ',', or 'models': the "
                 "Llama-3.1-8B and Qwen3-14B linear shapes at T=512,2048,8192")
  p.add_argument("--autotune", action="store_true",
                 help="tune each case's tile first (cached, see "
                 "pallas_kernels/fused_dw/autotune.py)")
  p.add_argument("--mosaic", action="store_true",
                 help="also time the Mosaic GPU kernel (implementation='mosaic')")
  p.add_argument("--no-triton", dest="triton", action="store_false",
                 help="leave the Triton kernel out (--autotune tunes it, so "
                 "not with that)")
  p.add_argument("--torch", action="store_true",
                 help="also time PyTorch dW + torch.optim.AdamW(fused=True)")
  p.add_argument("--rules", default=",".join(RULES),
                 help=f"comma-separated, from {sorted(RULES) + sorted(FOLD_RULES)}")
  p.add_argument("--modes", default=",".join(MODES),
                 help=f"comma-separated, from {list(MODES)}")
  p.add_argument("--reps", type=int, default=30,
                 help="ops timed per round (--timing chain) or calls timed "
                 "(--timing call)")
  p.add_argument("--timing", choices=("chain", "call"), default="chain",
                 help="chain: --chain ops per jitted call, as in a training "
                 "step (default); call: one op per jitted call")
  p.add_argument("--chain", type=int, default=3,
                 help="ops per jitted call with --timing chain")
  p.add_argument("--barrier", choices=BARRIERS, default="all",
                 help="with --timing chain, what each op's optimization "
                 "barrier holds: all = x, dY, W, states and hyperparameters; "
                 "state = all but x and dY (needs --chain <= 3, the sets "
                 "rotated)")
  p.add_argument("--unfused-grad-dtype", choices=("float32", "bfloat16"),
                 default="float32",
                 help="dW's dtype in the timed unfused step: float32 (the "
                 "fused op's reference) or bfloat16 (as an unfused step with "
                 "bf16 params, e.g. optax's, keeps its gradient; stop 40; "
                 "default float32). The 'xla dW' columns time the fp32-result "
                 "dW either way")
  p.add_argument("--rounds", type=int, default=3,
                 help="rounds of --reps ops (the median is kept) with "
                 "--timing chain")
  p.add_argument("--peak-size", type=int, default=None,
                 help="n of the n³ bf16 matmul and 16·n² fp32 pass that measure "
                 "the peaks (default 8192; 256 with --interpret)")
  p.add_argument("--out", default="experiments/results",
                 help="directory for the JSON (default: %(default)s)")
  p.add_argument("--interpret", action="store_true",
                 help="run the kernel in interpret mode (a CPU smoke test)")
  p.add_argument("--table-from", metavar="FILE",
                 help="print the table of an earlier run (its JSON, or the "
                 "log with one JSON row per line) instead of measuring")
  p.add_argument("--by-shape", action="store_true",
                 help="with --table-from: one line per shape, the modes side "
                 "by side")
  p.add_argument("--peaks", metavar="FLOPS,BYTES_PER_S", default=NOMINAL_PEAKS,
                 help="the floor's peaks (default: the H200's nominal "
                 f"{NOMINAL_PEAKS}); 'measured': this run's (or, with "
                 "--table-from, that run's) measured peaks")
  a = p.parse_args(argv)
  if a.table_from:
    saved = _runs.read_json_or_log(a.table_from, '{"shape"')
    if isinstance(saved, dict):
      rows, peaks = saved["rows"], (saved["peak_flops"], saved["peak_bw"])
    else:  # a log: one row per line, the peaks on its "measured peaks" line
      rows, peaks = saved, _log_peaks(a.table_from)
    if not rows:
      raise SystemExit(f"--table-from: {a.table_from} holds no rows (lines "
                       "starting with {\"shape\")")
    if a.peaks != "measured":
      peaks, source = _parse_peaks(a.peaks), "given"
    elif peaks:
      source = "measured in that run"
    else:
      raise SystemExit("--table-from: the log has no 'measured peaks' line; "
                       "give --peaks")
    if a.by_shape:
      print_table_by_shape(rows, *peaks)
    else:
      print_table(rows, *peaks, source)
    return rows
  if a.autotune and not a.triton:
    raise SystemExit("--autotune tunes the Triton kernel: not with --no-triton")
  if not (a.triton or a.mosaic):
    raise SystemExit("--no-triton without --mosaic leaves no kernel to time")
  for name in ("reps", "chain", "rounds"):
    if getattr(a, name) < 1:
      raise SystemExit(f"--{name}: must be >= 1, got {getattr(a, name)}")
  if a.by_shape:
    raise SystemExit("--by-shape: only with --table-from")
  chain = a.chain if a.timing == "chain" else 0
  if a.barrier == "state" and not chain:
    raise SystemExit("--barrier: only with --timing chain")
  if a.barrier == "state" and chain > 3:
    raise SystemExit(f"--barrier state: --chain must be <= 3 (the input sets "
                     f"rotated), got {chain}")
  known = {**RULES, **FOLD_RULES}
  for r in a.rules.split(","):
    if r not in known:
      raise SystemExit(f"--rules: {r!r} is not one of {sorted(known)}")
  rules = [known[r] for r in a.rules.split(",")]
  modes = a.modes.split(",")
  for m in modes:
    if m not in MODES:
      raise SystemExit(f"--modes: {m!r} is not one of {list(MODES)}")
  shapes = []
  specs = a.shapes.split(",")
  if a.shapes == "models":
    specs = [f"{t}:{d}" for t in (512, 2048, 8192) for d in MODEL_SHAPES]
  for spec in specs:
    t, dims = spec.split(":")
    d_in, d_out = dims.split("x")
    shapes.append((int(t), int(d_in), int(d_out)))
  rng = np.random.default_rng(0)
  given = None if a.peaks == "measured" else _parse_peaks(a.peaks)
  if a.peak_size is None:
    a.peak_size = 256 if a.interpret else 8192
  measured = measure_peaks(a.peak_size)
  print(f"measured peaks: {measured[0] / 1e12:.0f} TFLOP/s (bf16 {a.peak_size}³ "
        f"matmul), {measured[1] / 1e12:.2f} TB/s (fp32 pass)", flush=True)
  if a.interpret:
    print("--interpret: the kernels run in interpret mode on this host, so the "
          "checks hold but the times, % of floor and speed-ups do not "
          "describe a GPU", flush=True)
  flops_peak, bw_peak = given or measured
  rows = []
  for t, d_in, d_out in shapes:
    key = jax.random.key(int(rng.integers(2**31)))
    sets = [(jax.random.normal(jax.random.fold_in(key, 2 * i), (t, d_in), jnp.bfloat16),
             jax.random.normal(jax.random.fold_in(key, 2 * i + 1), (t, d_out),
                               jnp.bfloat16))
            for i in range(3)]
    if chain:
      t_dw = _time_chained(_dw_chain(chain, a.barrier), sets, (), (), a.reps, chain,
                           a.rounds, feed_back=False)
    else:
      t_dw = _time(jax.jit(weight_grad_reference), sets, a.reps)
    torch_run = (torch_adamw_seconds(t, d_in, d_out, a.reps, chain, a.rounds)
                 if a.torch else None)
    t_torch, torch_timing = torch_run or (None, None)
    for rule in rules:
      for mode in modes:
        try:
          r = bench_case(rule, mode, t, d_in, d_out, sets, a.reps, rng,
                         a.interpret, a.autotune, a.mosaic, chain, a.rounds,
                         a.triton, a.barrier, a.unfused_grad_dtype)
        except Exception as e:  # reported, not hidden: the table shows it
          r = dict(rule=rule.name, mode=mode, error=f"{type(e).__name__}: "
                   f"{str(e)[:200]}", bytes=float("nan"),
                   unfused_grad_dtype=a.unfused_grad_dtype)
        floor = floor_s(t, d_in, d_out, r["bytes"], flops_peak, bw_peak)
        rows.append(dict(shape=[t, d_in, d_out], xla_dw_s=t_dw, floor_s=floor,
                         torch_adamw_s=t_torch, torch_timing=torch_timing,
                         timing=a.timing, chain=chain,
                         barrier=a.barrier if chain else None,
                         sm_clock_mhz=sm_clock_mhz(), **r))
        print(json.dumps(rows[-1]), flush=True)

  print_table(rows, flops_peak, bw_peak,
              "measured" if a.peaks == "measured" else a.peaks)
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, f"bench_fused_dw_{int(time.time())}.json")
  with open(path, "w") as f:
    json.dump({"peak_flops": measured[0], "peak_bw": measured[1],
               "floor_peaks": [flops_peak, bw_peak], "timing": a.timing,
               "chain": chain, "rounds": a.rounds, "reps": a.reps,
               "barrier": a.barrier if chain else None,
               "device": jax.devices()[0].device_kind, "jax": jax.__version__,
               "python": platform.python_version(), "rows": rows}, f, indent=1)
  print(f"wrote {path}")
  return rows


if __name__ == "__main__":
  main()

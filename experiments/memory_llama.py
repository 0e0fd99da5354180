"""Training memory of real model architectures on one GPU: optax vs FORGE.

For a published architecture (``forge_jax.models.llama`` presets
``llama3.1-8b``, ``qwen3-14b``, ``qwen3-32b``; random weights, bf16 storage
and compute) and T tokens per step (batch 1), each variant is built, compiled
and run in its own process (on the GPU; ``cpu-tiny`` runs anywhere, as a
smoke test, where the live peak is "n/a"), and reports XLA's
``memory_analysis()`` (arguments, outputs, aliased, temp), the live
``peak_bytes_in_use`` after ``--steps`` steps (default 6; the process's
high-water mark, so it includes what the compile held on the device unless
``--compile-first`` compiles before the state is made: stop 44), the
peak right after the compile, the median step
time of the steps after the first two and tokens/s, and the seconds spent building the
model and state, lowering the step and compiling it (a variant that runs out
of ``--timeout`` is reported with the phase it was in):

* ``optax``: flax Dense everywhere, ``optax.adamw`` with bf16 params and bf16
  moments, params and state donated;
* ``forge-bf16``: the 7 projections per block and the untied ``lm_head``
  are ForgeDense and the embedding of an untied model a ForgeEmbed (AdamW
  fused, bf16 weights with stochastic rounding, bf16 moments), the rest
  (norms) AdamW with bf16 moments;
* ``forge-int8``: the same with int8 moments (absmax blocks of 64) for every
  param;
* ``forge-fold-int8``: FOAM inside the fused kernels of the blocks (fold
  level 3, int8 folded moments); the (fused) embedding and head keep plain
  AdamW with int8 moments;

``--embedding unfused`` keeps the embedding a flax Embed trained by the
step's ``fj.adamw``; under tensor parallelism (``--tp``) the head and
embedding stay unfused and replicated;

each ``unrolled`` or ``scan`` (``nn.scan`` over the blocks), with or without
per-block rematerialization (``remat``). A fused ``scan`` row's backward
(``inplace_scan``) reads the residuals its forward saved; ``scan+remat``
recomputes each block (before stop 43 both recomputed; such rows read so in
the table).

    python -m experiments.memory_llama --model llama3.1-8b --tokens 2048
    python -m experiments.memory_llama --model cpu-tiny --tokens 64   # smoke test
    python -m experiments.memory_llama --tp 2 --optimizers forge-int8  # 2 GPUs
    python -m experiments.memory_llama --attention cudnn  # flash attention
    python -m experiments.memory_llama --logits-dtype float32  # fp32 logits
    python -m experiments.memory_llama --peak-report  # what fills the peak
    # do two layouts / kernels train alike? (2 blocks at full width)
    python -m experiments.memory_llama --layers 2 --movement --steps 4 \
        --optimizers forge-bf16 --layouts scan+remat,unrolled+remat

Prints one markdown table, each row's loss per step (and with ``--movement``
each param's movement per layer, row beside row) and writes JSON to
``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from experiments import _runs
from experiments import peak_report
from experiments import profile_summary

GiB = 1024**3
OPTIMIZERS = ("optax", "forge-bf16", "forge-int8", "forge-fold-int8")
LAYOUTS = ("unrolled", "unrolled+remat", "scan", "scan+remat")


PHASE = "PHASE"
"""Prefix of the lines a variant's process prints as it finishes a phase
(``init``: the process's imports, the model and the train state;
``lower``: tracing and lowering the step;
``compile``: XLA's compile), with the seconds it took."""


_PHASES = ("init", "lower", "compile", "steps")


def _phases_done(stdout) -> tuple[str, str]:
  """(the phase a variant was in, 'init 5.7 s, lower 1.8 s' of those it
  finished) from the ``PHASE`` lines of its output (str, bytes or None)."""
  if isinstance(stdout, bytes):
    stdout = stdout.decode(errors="replace")
  done = [line.split()[1:3] for line in (stdout or "").splitlines()
          if line.startswith(PHASE + " ") and len(line.split()) == 3]
  running = _PHASES[min(len(done), len(_PHASES) - 1)]
  return running, ", ".join(f"{n} {sec} s" for n, sec in done)


def timeout_error(timeout: int, stdout) -> str:
  """The error of a variant killed after ``timeout`` s: which phase it was
  in and the seconds of those it finished (``init`` counts the process's
  imports), from the ``PHASE`` lines of its output."""
  running, finished = _phases_done(stdout)
  return (f"timeout after {timeout} s in {running}"
          + (f" ({finished} done)" if finished else ""))


def crash_error(message: str, stdout) -> str:
  """The error of a variant whose process failed: its last error line, and
  the phase it failed in when it had finished any."""
  running, finished = _phases_done(stdout)
  return message + (f" (in {running}; {finished} done)" if finished else "")


MEM_FRACTION = "0.97"
"""XLA_PYTHON_CLIENT_MEM_FRACTION of each variant's process unless the
caller's environment sets one: JAX's default (0.75) caps its allocator at 104
of an H200's 139.8 GiB, and Qwen3-32B with int8 moments needs 130.3 GiB (its
first run failed in ``init`` under the default). The peak reported is
``peak_bytes_in_use``, what the step used, not what was reserved."""


def child_env() -> dict:
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", MEM_FRACTION)
  return env


def _unrolled_init(model, key, tokens, how: dict | None = None):
  """``model.init`` of an unrolled Llama, built from its scanned twin.

  Initializing the unrolled 8B model directly took 80-125 s on the H200
  (against about 10 s scanned), most of it, presumably, compiling a
  program with 32 copies of the block. This initializes the same model
  with ``scan_layers=True`` and slices each stacked leaf into the
  ``layers_{i}`` entries one leaf at a time, through the host: the stack
  is copied to the host and freed on the device, and its layers are put
  back one at a time, so the device never holds a stack twice. The weights
  are other random draws than the unrolled init's; the result has the
  unrolled init's tree, shapes and dtypes exactly (checked against
  ``jax.eval_shape``; if they differ, the unrolled init runs instead). The
  row's ``init_peak_bytes`` is this path's (rows before stop 24: the
  direct init's). ``how``, if given, gets ``how['init']``: 'scanned twin'
  or, after that fallback, 'direct'."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  want = jax.eval_shape(model.init, key, tokens)
  cfg = model.config
  scanned = model.clone(config=dataclasses.replace(cfg, scan_layers=True))
  stacked = jax.jit(scanned.init)(key, tokens)
  out = {}
  for coll, tree in stacked.items():
    tree = dict(tree)
    layers = tree.pop("layers", None)
    out[coll] = tree
    if layers is None:
      continue
    leaves, treedef = jax.tree.flatten(layers["block"])
    per_layer = [[] for _ in range(cfg.n_layers)]
    for leaf in leaves:
      # Through the host: sliced on the device, a stack would be held twice
      # while its slices are made. The model's other stacks (e.g. FORGE's
      # moments, model variables) are all there by then: stop 25 saw the
      # 8B forge-bf16 init peak at the arguments + 3.77 GiB (one stacked
      # 4096×14336 leaf), above the step's own peak.
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        for i in range(cfg.n_layers):  # keys have no numpy form (and are small)
          per_layer[i].append(leaf[i])
        continue
      device = next(iter(leaf.devices()))
      host = np.asarray(jax.device_get(leaf))
      leaf.delete()
      for i in range(cfg.n_layers):
        per_layer[i].append(jax.device_put(host[i], device))
      del host
    for i in range(cfg.n_layers):
      tree[f"layers_{i}"] = jax.tree.unflatten(treedef, per_layer[i])
  del stacked
  same = (jax.tree.structure(out) == jax.tree.structure(want) and all(
      (a.shape, a.dtype) == (b.shape, b.dtype)
      for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want))))
  if not same:
    print("unrolled init from the scanned one: tree differs, initializing "
          "directly", flush=True)
    del out
    if how is not None:
      how["init"] = "direct"
    return jax.jit(model.init)(key, tokens)
  if how is not None:
    how["init"] = "scanned twin"
  return out


def build(model_name: str, tokens: int, optimizer: str, layout: str, *,
          attention: str = "einsum", logits_dtype: str = "float32",
          embedding: str = "fused", tp: int = 1, layers: int = 0,
          learning_rate: float = 1e-4):
  """One variant's model and optimizer: ``(cfg, model, batch, tx)``.

  The preset ``model_name`` (``layers`` > 0: that many blocks) in bf16 with
  ``layout``'s scan and remat; ``optimizer`` 'optax' (flax Dense,
  ``optax.adamw`` with bf16 moments) or a fused one ('forge-bf16',
  'forge-int8', 'forge-fold-int8': ForgeDense projections with AdamW, or
  fold_adam at l = 3, keeping moments of that dtype; the untied head fused
  too with AdamW, and the untied embedding with ForgeEmbed unless
  ``embedding='unfused'``, both on one GPU only: with ``tp`` > 1 they stay
  unfused and replicated). ``batch`` is (tokens, next tokens) of shape (1,
  ``tokens``) from key 1; ``tx`` the state's transform.

  Raises:
    ValueError: for ``embedding`` not 'fused' or 'unfused', ``layers``
      outside [0, the preset's blocks], or ``tp`` > 1 with 'optax'.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp
  import optax
  import flax.linen as nn

  import forge_jax as fj
  from forge_jax.models import llama

  if embedding not in ("fused", "unfused"):
    raise ValueError(f"embedding={embedding!r} must be 'fused' or 'unfused'")
  if tp > 1 and optimizer == "optax":
    raise ValueError("tp > 1 is for the fused variants (ForgeDense kernel_axes)")
  cfg = llama.get_config(
      model_name, max_seq_len=max(tokens, 8), remat="remat" in layout,
      scan_layers=layout.startswith("scan"), dtype=jnp.bfloat16,
      param_dtype=jnp.bfloat16, attention=attention,
      logits_dtype=jnp.dtype(logits_dtype),
      tensor_parallel_axis="model" if tp > 1 else None)
  if not 0 <= layers <= cfg.n_layers:
    raise ValueError(f"layers={layers} must be in [0, {cfg.n_layers}] "
                     f"(0: all of {model_name}'s blocks)")
  if layers:
    cfg = dataclasses.replace(cfg, n_layers=layers)
  lr = learning_rate
  head = embed = None  # flax Dense and Embed
  if optimizer == "optax":
    dense, tx = nn.Dense, optax.adamw(lr, mu_dtype=jnp.bfloat16)
  else:
    moments = jnp.int8 if optimizer.endswith("int8") else jnp.bfloat16
    kw = dict(mu_dtype=moments, nu_dtype=moments)
    fused = (fj.fold_adam(lr, fold_level=3, **kw) if "fold" in optimizer
             else fj.adamw(lr, **kw))
    dense = functools.partial(fj.ForgeDense, optimizer=fused)
    # The untied head (V x D, the largest matrix) fused too, plain AdamW with
    # the same moments: its gradient never exists either. One GPU only: under
    # tensor parallelism the head stays an unfused, replicated Dense.
    # The untied embedding too (ForgeEmbed): its (V, D) gradient never
    # exists either.
    if not cfg.tie_embeddings and tp == 1:
      head = functools.partial(fj.ForgeDense, optimizer=fj.adamw(lr, **kw))
      if embedding == "fused":
        embed = functools.partial(fj.ForgeEmbed, optimizer=fj.adamw(lr, **kw))
    tx = fj.adamw(lr, **kw)
  model = llama.Llama(cfg, dense_cls=dense, head_cls=head, embed_cls=embed)
  batch = jax.random.randint(jax.random.key(1), (1, tokens + 1), 0, cfg.vocab_size)
  return cfg, model, (batch[:, :-1], batch[:, 1:]), tx


def lm_loss(model):
  """``loss_fn(variables, (tokens, next_tokens))``: the model's mean next-token
  cross-entropy, as every variant's step takes it."""
  from forge_jax.models import llama  # pylint: disable=g-import-not-at-top

  def loss_fn(v, b):
    return llama.cross_entropy_loss(model.apply(v, b[0]), b[1])
  return loss_fn


def abstract_state(model, tx, key, tokens):
  """Shapes and dtypes of ``fj.TrainState.create`` over ``model.init(key,
  tokens)`` (``jax.eval_shape``: nothing is computed or allocated)."""
  import jax  # pylint: disable=g-import-not-at-top
  import forge_jax as fj  # pylint: disable=g-import-not-at-top
  return jax.eval_shape(lambda: fj.TrainState.create(
      apply_fn=model.apply, variables=model.init(key, tokens), tx=tx))


# A marker once the listener is registered, then one entry per lowering of
# a jitted function named `step`.
_STEP_LOWERINGS = []


def _count_step_lowerings() -> int:
  """Lowerings of a jitted ``step`` in this process so far (JAX's
  monitoring events; the listener is registered on the first call).

  ``run_one`` expects one per variant: another would be a second compile of
  the step during the timed steps (stop 42: calling the jitted step after
  ``lower(...).compile()`` did that in the unrolled and tensor-parallel
  rows)."""
  import jax  # pylint: disable=g-import-not-at-top
  if not _STEP_LOWERINGS:
    _STEP_LOWERINGS.append(None)  # registered
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: _STEP_LOWERINGS.append(secs) if (
            event == "/jax/core/compile/jaxpr_to_mlir_module_duration"
            and kw.get("fun_name") == "jit(step)") else None)
  return len(_STEP_LOWERINGS) - 1


def mosaic_tile(name: str):
  """The ``MosaicConfig`` called ``name`` in ``experiments.probe_mosaic.CONFIGS``.

  Raises:
    ValueError: ``name`` is not one of them.
  """
  from experiments import probe_mosaic  # pylint: disable=g-import-not-at-top
  if name not in probe_mosaic.CONFIGS:
    raise ValueError(f"mosaic tile {name!r}: expected one of "
                     f"{sorted(probe_mosaic.CONFIGS)}")
  return probe_mosaic.CONFIGS[name]


def use_mosaic_tile(name: str) -> None:
  """Makes the fused kernel's default Mosaic configuration the tile called
  ``name`` in ``experiments.probe_mosaic.CONFIGS`` for every op it covers
  with 2-byte W and states (the bf16 variants' projections; int8 or folded
  states keep their own default), in this process; the other ops keep
  ``mosaic_default_config``'s choice. For comparing a tile measured per op
  in a whole training step.

  Raises:
    ValueError: ``name`` is not a tile of ``probe_mosaic.CONFIGS``.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  from pallas_kernels.fused_dw import api, kernel_mosaic  # pylint: disable=g-import-not-at-top
  tile = mosaic_tile(name)
  default = api.mosaic_default_config

  def chosen(x, dy, w, state, rule, seed, interpret=False):
    state = tuple(state)
    if (not quantization.any_quantized(state)  # int8: no .dtype to read
        and not kernel_mosaic.is_folded(rule)
        and all(jnp.dtype(a.dtype).itemsize == 2 for a in (w, *state))
        and not kernel_mosaic.unsupported_reason(x, dy, w, state, rule, seed,
                                                 tile, interpret)):
      return tile
    return default(x, dy, w, state, rule, seed, interpret)
  api.mosaic_default_config = chosen


def run_one(model_name: str, tokens: int, optimizer: str, layout: str,
            steps: int = 6, tp: int = 1, attention: str = "einsum",
            logits_dtype: str = "float32", implementation: str = "auto",
            embedding: str = "fused", profile: bool = False,
            layers: int = 0, movement: bool = False,
            pipelined: int = 4, compiler_options: str = "",
            compile_first: bool = False) -> dict:
  """Builds, compiles and runs one variant here; returns its measurements.

  ``layers`` > 0 builds the preset with that many blocks (every width, the
  vocabulary and the head as published; the output projections' init
  scale follows the block count, so these are not the whole model's first
  blocks): a quick check of a full-width model's step, such as whether two
  layouts or implementations train alike (the row's ``losses``, one per
  step). The row's ``init`` says how the variables were made ('scanned
  twin' for an unrolled model built from its scanned twin, else 'direct'). ``movement`` adds each
  param's mean |new - initial| per layer after the steps (``movement``,
  keyed as :func:`layer_leaves`; the initial params are copied to the host
  first), which such variants share up to rounding: an update applied
  twice, or lost, shows there.

  ``step_s`` is the median of steps each waited for (the host dispatches
  step k+1 after step k's loss is back, so the host's work before a step's
  first kernel, such as updating the step's CUDA graph, is in it).
  ``pipelined`` > 0 then runs that many more steps dispatched back to back,
  as a training loop that does not read each loss does, and waits once at
  the end: ``pipelined_step_s`` is their mean (the host's work for step
  k+1 overlaps step k on the device).

  With ``tp > 1`` the projections are split over ``tp`` devices (Megatron
  tensor parallelism, ``LlamaConfig.tensor_parallel_axis``): the model is
  initialized directly into its shards and the step runs under
  ``jax.set_mesh``; the peak reported is the largest over the devices.

  ``compiler_options``: XLA options for compiling the step, both optimizers
  alike (:func:`parse_compiler_options`; '' for none), e.g.
  ``'xla_gpu_enable_command_buffer='``: ``jax.jit``'s
  ``compiler_options``, as ``fj.make_train_step`` passes them on. The row
  keeps them as given (``compiler_options``) and as passed to XLA
  (``xla_options``, with 'scan' expanded: its meaning changed in stop 37,
  from three options to one).

  ``peak_bytes_in_use`` is the process's high-water mark, so ``peak_bytes``
  also holds whatever compiling the step allocated on the device
  (presumably XLA's GPU autotuner, which times candidate kernels on buffers
  of its own; stop 44); ``compile_peak_bytes`` is the peak right after the
  compile, before the first step. By default the state is made first and
  the step compiled on it, as ``jax.jit`` compiles a training loop's step
  at its first call, so both peaks include the arguments. ``compile_first``
  lowers and compiles the step on the state's shapes (``jax.eval_shape``)
  before the state is made: ``compile_peak_bytes`` is then the compile's
  own (and the batch's), ``init_peak_bytes`` the larger of it and
  initialization's, and ``peak_bytes`` the largest of those and the
  steps'. One device only. The phases' seconds then run setup (the imports,
  the model and the abstract state), lower, compile, init; by default
  init (with the imports), lower, compile.

  Raises:
    ValueError: for ``pipelined`` not an int >= 0, or ``compile_first``
      with ``tp`` > 1 (a sharded state's shardings exist only with it).
  """
  if not isinstance(pipelined, int) or pipelined < 0:
    raise ValueError(f"pipelined={pipelined!r} must be an int >= 0 (0: no "
                     "pipelined steps)")
  if compile_first and tp > 1:
    raise ValueError("compile_first=True needs tp=1: a sharded state's "
                     "shardings exist only once it is made")
  xla_options = parse_compiler_options(compiler_options)
  t_phase = time.perf_counter()  # the first phase counts the imports below
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np
  import optax

  import forge_jax as fj
  from forge_jax.models import llama
  from pallas_kernels import fused_dw

  lowerings_before = _count_step_lowerings()
  cfg, model, batch, tx = build(model_name, tokens, optimizer, layout,
                                attention=attention, logits_dtype=logits_dtype,
                                embedding=embedding, tp=tp, layers=layers)
  mesh = None
  if tp > 1:
    mesh = jax.make_mesh((tp,), ("model",), devices=jax.devices()[:tp],
                         axis_types=(jax.sharding.AxisType.Auto,))
  # The fused step is traced and run under the mesh (tensor parallelism).
  in_mesh = (contextlib.nullcontext if mesh is None
             else functools.partial(jax.set_mesh, mesh))
  phases = {}

  def phase(name):  # seconds per phase; printed so a timeout can name it
    nonlocal t_phase
    now = time.perf_counter()
    phases[name] = now - t_phase
    t_phase = now
    print(f"{PHASE} {name} {phases[name]:.1f}", flush=True)

  init_key = jax.random.key(0)
  init_how = {"init": "direct"}  # unrolled: from the scanned twin if it can

  def make_state():
    if mesh is not None:  # straight into the shards: no whole copy on a device
      shapes = jax.eval_shape(model.init, init_key, batch[0])
      variables = jax.jit(model.init, out_shardings=jax.tree.map(
          lambda s: jax.sharding.NamedSharding(mesh, s),
          llama.tensor_parallel_specs(shapes, "model", tp)))(init_key, batch[0])
    elif not cfg.scan_layers:
      variables = _unrolled_init(model, init_key, batch[0], how=init_how)
    else:
      variables = jax.jit(model.init)(init_key, batch[0])
    state = fj.TrainState.create(apply_fn=model.apply, variables=variables,
                                 tx=tx)
    del variables
    jax.block_until_ready(state)
    return state

  def peak_bytes():  # the largest device's peak so far (None off the GPU)
    peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use")
             for d in jax.devices()[:tp]]
    return None if None in peaks else max(peaks)

  loss_fn = lm_loss(model)

  if optimizer == "optax":
    @functools.partial(jax.jit, donate_argnums=(0,),
                       compiler_options=xla_options or None)
    def step(state, b):
      loss, grads = jax.value_and_grad(
          lambda p: loss_fn({"params": p}, b))(state.params)
      updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
      return state.replace(step=state.step + 1,
                           params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state), {"loss": loss}
  else:
    step = fj.make_train_step(loss_fn, check_backward=False,
                              implementation=implementation,
                              compiler_options=xla_options)

  def compile_step(state):
    """``state``: the TrainState, or its shapes (compile_first)."""
    with in_mesh():
      lowered = step.lower(state, batch)
    phase("lower")
    # The steps below call this executable: the one whose memory_analysis
    # the row reports. Calling `step` instead lowered and compiled it again
    # at its first call wherever the state mixed committed and uncommitted
    # arrays (stop 42, on the CPU: the unrolled init and the
    # tensor-parallel rows; presumably why stop 41's 8B int8 unrolled row
    # ran out of time in its steps on the H200, 42 s after a 44 s compile).
    compiled = lowered.compile()
    phase("compile")
    return compiled

  if compile_first:  # nothing of the state on the device while XLA compiles
    shapes = abstract_state(model, tx, init_key, batch[0])
    phase("setup")
    compiled = compile_step(shapes)
    compile_peak = peak_bytes()  # the compile's own (and the batch's)
    state = make_state()
    phase("init")
    init_peak = peak_bytes()  # the larger of the compile's and the init's
  else:
    state = make_state()
    phase("init")
    init_peak = peak_bytes()  # initialization's, before any step
    compiled = compile_step(state)
    compile_peak = peak_bytes()  # the state's plus what the compile took
  ma = compiled.memory_analysis()
  hlo = profile_summary.hlo_summary(compiled.as_text() or "")
  analysis = {k: int(getattr(ma, k, 0) or 0) for k in (
      "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
      "temp_size_in_bytes")} if ma is not None else {}
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(
      (state.opt_state, state.forge_state)))
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(state.params))
  initial = layer_leaves(jax.device_get(state.params)) if movement else None
  times, losses = [], []
  for i in range(steps):
    t0 = time.perf_counter()
    with in_mesh():
      state, m = compiled(state, batch)
    jax.block_until_ready(m["loss"])
    times.append(time.perf_counter() - t0)
    losses.append(float(m["loss"]))
    if not np.isfinite(losses[-1]):
      raise FloatingPointError(f"loss {losses[-1]} at step {i}")
  median = float(np.median(times[2:] or times))
  # Peak and loss as of the timed steps (the profiled one comes after).
  peak, loss = peak_bytes(), losses[-1]
  extra = dict(init_how, hlo=hlo)
  if xla_options:  # as given ('scan') and as XLA got them (since stop 37)
    extra["compiler_options"] = compiler_options
    extra["xla_options"] = dict(xla_options)
  if layers:
    extra["n_layers"] = layers
  if cfg.scan_layers and optimizer != "optax":
    # inplace_scan's backward (since stop 43): 'remat' recomputes each block,
    # 'saved' reads the residuals its forward scan saved. Before, a fused
    # scan always rematerialized ('scan' rows without this key).
    extra["scan_backward"] = "remat" if cfg.remat else "saved"
  if movement:  # after the timed steps, before a profiled one
    final = layer_leaves(jax.device_get(state.params))
    extra["movement"] = {k: float(np.mean(np.abs(
        final[k].astype(np.float32) - initial[k].astype(np.float32))))
        for k in initial}
    del final
  if pipelined:  # after the movement, before a profiled step
    with in_mesh():
      t0 = time.perf_counter()
      for _ in range(pipelined):
        state, m = compiled(state, batch)
      jax.block_until_ready((state, m))
    extra["pipelined_step_s"] = (time.perf_counter() - t0) / pipelined
    if not np.isfinite(float(m["loss"])):
      raise FloatingPointError(f"loss {float(m['loss'])} in a pipelined step")
  if profile:  # one more step under the profiler: device time by kernel kind
    trace_dir = tempfile.mkdtemp(prefix="forge_jax_trace_")
    try:
      with jax.profiler.trace(trace_dir):
        with in_mesh():
          state, m = compiled(state, batch)
        jax.block_until_ready(m["loss"])
      extra["profile"] = profile_summary.summarize(trace_dir)
    finally:
      shutil.rmtree(trace_dir, ignore_errors=True)
  lowerings = _count_step_lowerings() - lowerings_before
  if lowerings != 1:
    print(f"WARNING: the step was lowered {lowerings} times, not once",
          flush=True)
  return dict(model=model_name, params=llama.num_params(cfg), tokens=tokens,
              optimizer=optimizer, layout=layout, tp=tp, attention=attention,
              logits_dtype=logits_dtype,
              implementation=None if optimizer == "optax" else implementation,
              resolved_implementation=None if optimizer == "optax" else
              fused_dw.resolve_implementation(implementation),
              fused_embedding=model.embed_cls is not None,
              **analysis,
              param_bytes=param_bytes, optimizer_state_bytes=state_bytes,
              peak_bytes=peak, step_s=median,
              tokens_per_s=tokens / median, loss=loss, losses=losses,
              compile_s=phases["compile"], init_s=phases["init"],
              lower_s=phases["lower"], setup_s=phases.get("setup"),
              init_peak_bytes=init_peak,
              compile_peak_bytes=compile_peak, compile_first=compile_first,
              step_lowerings=lowerings,
              device=jax.devices()[0].device_kind, jax=jax.__version__,
              **extra)


def parse_compiler_options(text: str) -> dict:
  """'name=value,name=value' as ``jax.jit``'s ``compiler_options``: 'true'
  and 'false' become bools, other values stay strings (XLA parses them; an
  empty value clears a list option, e.g. 'xla_gpu_enable_command_buffer=').
  A comma-separated item without '=' continues the value before it, as
  XLA's list options take them: 'xla_gpu_enable_command_buffer=FUSION,CUBLAS'.
  'scan' stands for ``fj.SCAN_GPU_COMPILER_OPTIONS`` (a scanned model's gemms
  read the layers' kernels in place from their stacks).

  Raises:
    ValueError: for a first item without '=', an empty name, or a name
      given twice.
  """
  if text.strip() == "scan":
    from forge_jax import SCAN_GPU_COMPILER_OPTIONS  # pylint: disable=g-import-not-at-top
    return dict(SCAN_GPU_COMPILER_OPTIONS)
  items = []  # [name, value]
  for item in (x.strip() for x in text.split(",")):
    name, eq, value = item.partition("=")
    if eq and name.strip():
      if name.strip() in (n for n, _ in items):
        raise ValueError(f"compiler options {text!r}: {name.strip()!r} is given twice")
      items.append([name.strip(), value.strip()])
    elif eq or (item and not items):
      raise ValueError(f"compiler options {text!r}: {item!r} is not name=value")
    elif item:  # the next element of the previous option's list
      items[-1][1] += "," + item
  return {n: {"true": True, "false": False}.get(v.lower(), v) for n, v in items}


def layer_leaves(params) -> dict:
  """``params`` flattened to 'a/b/c' keys that name a layer the same way in
  every layout: a scanned stack's 'layers/block/P' is split along its
  first axis into 'layers[i]/P', an unrolled 'layers_i/P' becomes
  'layers[i]/P'; other leaves keep their path."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  out = {}
  for k, v in traverse_util.flatten_dict(dict(params)).items():
    if k[:2] == ("layers", "block"):
      for i in range(v.shape[0]):
        out["/".join((f"layers[{i}]",) + k[2:])] = v[i]
    elif k[0].startswith("layers_") and k[0][7:].isdigit():
      out["/".join((f"layers[{int(k[0][7:])}]",) + k[1:])] = v
    else:
      out["/".join(k)] = v
  return out


def print_movements(rows) -> None:
  """``--movement``: each param's mean |new - initial| per row, side by
  side, marked where it differs from the first row's by over 5% (with the
  ratio) or where one of the two is 0 and the other is not."""
  rows = [r for r in rows if "movement" in r]
  if not rows:
    return
  keys = sorted({k for r in rows for k in r["movement"]})
  print("\nmean |new - initial| per param after the steps (× the first "
        "row's where it differs by over 5%):")
  print("| param | " + " | ".join(
      f"{i + 1}: T={r['tokens']} {r['optimizer']} {_layout_label(r)}"
      for i, r in enumerate(rows)) + " |")
  print("|---|" + "---|" * len(rows))
  for k in keys:
    ref = rows[0]["movement"].get(k)
    cells = []
    for r in rows:
      v = r["movement"].get(k)
      if v is None:
        cells.append("—")
      elif ref is None or r is rows[0]:
        cells.append(f"{v:.3e}")
      elif ref == 0:
        cells.append(f"{v:.3e}" + (" (first row: 0)" if v else ""))
      else:
        off = abs(v / ref - 1) > 0.05
        cells.append(f"{v:.3e}" + (f" (×{v / ref:.2f})" if off else ""))
    print(f"| {k} | " + " | ".join(cells) + " |")


def _model_label(row: dict) -> str:
  """The preset's name, with its block count where ``--layers`` cut it."""
  n = row.get("n_layers")
  return row["model"] + (f" ({n} layer{'s' if n > 1 else ''})" if n else "")


def print_losses(rows) -> None:
  """Each measured row's loss per step (rows before stop 26: the last only),
  to compare variants that should train alike (same model, init and batch:
  a layout, the kernel implementation)."""
  rows = [r for r in rows if "error" not in r]
  if not rows:
    return
  print("\nloss per step (every row: init key 0, batch key 1):")
  for r in rows:
    losses = r.get("losses") or [r["loss"]]
    print(f"  {_model_label(r)} T={r['tokens']} {r['optimizer']} "
          f"{_layout_label(r)}: " + " ".join(f"{v:.4f}" for v in losses))


def print_profiles(rows) -> None:
  """Each profiled row's device time by kind of kernel (``--profile``), and
  each row's command buffers (``profile_summary.hlo_summary``)."""
  for r in rows:
    if "hlo" in r:
      h = r["hlo"]
      print(f"\n{_model_label(r)} {r['optimizer']} {_layout_label(r)} T={r['tokens']}: "
            f"{h['command_buffers']} calls of command_buffer computations in the HLO; "
            f"fusions inside/outside {h['fusions'][0]}/{h['fusions'][1]}; custom calls "
            "inside/outside " + (", ".join(f"{t} {v[0]}/{v[1]}" for t, v in
                                           h["custom_calls"].items()) or "none"))
    if "profile" in r:
      profile_summary.print_summary(
          r["profile"], f"{r['optimizer']} {_layout_label(r)} T={r['tokens']}: "
          f"step {r['step_s'] * 1e3:.1f} ms wall, ")


def write_peak_report(dump_dir: str, path: str, top: int = 10) -> dict:
  """Writes the step's peak report (experiments/peak_report) to ``path``.

  Returns:
    The JSON summary: ``path``, ``peak_index``, ``parameter_bytes``,
    ``other_bytes``, ``by_buffer`` (bytes live at the peak per kind of
    allocation: ``argument``, ``temp``, ...) and the ``top`` largest values
    outside argument buffers as
    ``[bytes, shape, op_name]``; with the buffer assignment dumped,
    ``temp_peak``: the temp allocation's own maximum (``allocation_bytes``,
    ``live_bytes``, ``index``, ``top``). ``{"error": ...}`` if the dump has
    no live ranges of the step.
  """
  try:
    report = peak_report.summarize(dump_dir, "jit_step")
  except (FileNotFoundError, ValueError) as e:
    return {"error": str(e)[:300]}
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    f.write(peak_report.format_report(report) + "\n")
  def rows(values):
    return [[v.bytes, v.shape, v.op_name] for v in values[:top]]

  summary = dict(
      path=path, peak_index=report.peak_index,
      parameter_bytes=report.parameter_bytes, other_bytes=report.other_bytes,
      by_buffer={k: report.bytes_in(k) for k in peak_report.BUFFER_KINDS
                 if report.bytes_in(k)},
      top=rows(report.others()))
  tp = report.temp_peak
  if tp is not None:
    summary["temp_peak"] = dict(
        allocation_bytes=tp.allocation_bytes, live_bytes=tp.live_bytes,
        index=tp.index, top=rows(tp.values))
  return summary


def _layout_label(row: dict) -> str:
  """The layout, plus the attention and logits dtype when not the defaults
  of the first runs (einsum attention, float32 logits)."""
  label = row["layout"]
  if (row["layout"] == "scan" and row.get("optimizer", "optax") != "optax"
      and "scan_backward" not in row):
    label += " (block rematerialized: a fused scan before stop 43)"
  if row.get("attention", "einsum") != "einsum":
    label += f", {row['attention']} attention"
  if row.get("logits_dtype", "float32") != "float32":
    label += f", {row['logits_dtype'].replace('bfloat16', 'bf16')} logits"
  if "xla" in (row.get("implementation"), row.get("resolved_implementation")):
    # no kernel: XLA's dW, then the update ('auto' off the GPU resolves so)
    label += ", update unfused in the backward (xla)"
  elif row.get("implementation"):  # fused variants since stop 15
    label += f", {row['implementation']} kernel"
  if row.get("fused_embedding"):  # since stop 19
    label += ", ForgeEmbed"
  if row.get("compiler_options"):  # since stop 32
    label += f", XLA {row['compiler_options']}"
  if row.get("mosaic_tile"):  # since stop 47
    label += f", Mosaic tile {row['mosaic_tile']}"
  if row.get("compile_first"):  # since stop 44: 'compile peak' is its own
    label += ", compiled before the state"
  return label


def print_table(rows: list[dict]) -> None:
  """The markdown table of ``rows`` (run_one's dicts, or error rows).

  Bytes are per device (with ``tp`` > 1 the largest device's peak and
  arguments) except "params" and "opt state", which are the totals.
  """
  models = sorted({_model_label(r) for r in rows})
  print(f"\n{', '.join(models)}: batch 1 × T tokens, bf16 params and compute")
  print("| model | TP | T | optimizer | layout | args GiB | temp GiB | alias GiB | live peak GiB | "
        "params GiB | opt state GiB | peak - args GiB | init peak GiB | "
        "compile peak GiB | step ms | step ms, pipelined | tokens/s | "
        "init / lower / compile s |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    layout = _layout_label(r)
    if "error" in r:
      print(f"| {_model_label(r)} | {r.get('tp', 1)} | {r['tokens']} | {r['optimizer']} | "
            f"{layout} | {r['error']} | | | | | | | | | | | | |")
      continue
    g = lambda k: f"{r[k] / GiB:.2f}" if r.get(k) is not None else "n/a"  # noqa: E731
    # What the peak holds besides the step's arguments (this device's
    # weights, optimizer state and batch): activations and temporaries, or
    # what the compile held where that was more (stop 44).
    rest = ("n/a" if r.get("peak_bytes") is None else
            f"{(r['peak_bytes'] - r['argument_size_in_bytes']) / GiB:.2f}")
    pipe = (f"{r['pipelined_step_s'] * 1e3:.1f}" if r.get("pipelined_step_s")
            else "n/a")  # rows before stop 31, or --pipelined 0
    print(f"| {_model_label(r)} | {r.get('tp', 1)} | {r['tokens']} | {r['optimizer']} | {layout} | "
          f"{g('argument_size_in_bytes')} | {g('temp_size_in_bytes')} | "
          f"{g('alias_size_in_bytes')} | {g('peak_bytes')} | {g('param_bytes')} | "
          f"{g('optimizer_state_bytes')} | {rest} | {g('init_peak_bytes')} | "
          f"{g('compile_peak_bytes')} | {r['step_s'] * 1e3:.1f} | {pipe} | "
          f"{r['tokens_per_s']:,.0f} | {_phase_seconds(r)} |")


def _phase_seconds(row: dict) -> str:
  """'init / lower / compile' seconds (rows before stop 18: compile only)."""
  return " / ".join("n/a" if row.get(k) is None else f"{row[k]:.1f}"
                    for k in ("init_s", "lower_s", "compile_s"))


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--model", default="llama3.1-8b",
                 help="a forge_jax.models.llama preset: llama3.1-8b, qwen3-14b, "
                 "qwen3-32b, cpu-tiny (smoke test), ...")
  p.add_argument("--tokens", default="2048", help="comma-separated T values")
  p.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                 help=f"comma-separated, from {list(OPTIMIZERS)}")
  p.add_argument("--layouts", default="unrolled+remat,scan+remat",
                 help=f"comma-separated, from {list(LAYOUTS)}")
  p.add_argument("--steps", type=int, default=6,
                 help="steps run per variant (the step time is the median of "
                 "those after the first two)")
  p.add_argument("--movement", action="store_true",
                 help="add each param's mean |new - initial| per layer to the "
                 "row and print them side by side (variants that should "
                 "train alike; copies the params to the host first). A mean "
                 "of magnitudes: blind to a sign error or two swapped layers; "
                 "and the norms' bf16 scales (about 1, updated unfused and "
                 "rounded to nearest) do not move at the learning rate 1e-4")
  p.add_argument("--layers", type=int, default=0,
                 help="build the model with this many blocks, at most the "
                 "preset's (0: all); the widths, vocabulary and head stay the "
                 "preset's")
  p.add_argument("--tp", type=int, default=1,
                 help="tensor parallelism over this many GPUs (fused variants)")
  p.add_argument("--attention", default="einsum",
                 choices=("einsum", "xla", "cudnn", "auto"),
                 help="LlamaConfig.attention (cudnn: flash attention, no "
                 "S x S scores in memory)")
  p.add_argument("--logits-dtype", default="bfloat16",
                 choices=("float32", "bfloat16"),
                 help="LlamaConfig.logits_dtype: bfloat16 (the head's own "
                 "output, default) keeps no fp32 T x V logits or gradient")
  p.add_argument("--implementation", default="auto",
                 choices=("triton", "mosaic", "auto", "xla"),
                 help="the fused kernel of the FORGE variants (auto: Mosaic on "
                 "Hopper where it covers the op, else Triton; xla: no kernel, "
                 "XLA's dW then the update inside each layer's backward, its "
                 "gradient in device memory until the update has run)")
  p.add_argument("--embedding", default="fused",
                 choices=("fused", "unfused"),
                 help="the untied embedding of the FORGE variants on one GPU: "
                 "a ForgeEmbed (fused, default) or a flax Embed trained by "
                 "the step's fj.adamw (unfused)")
  p.add_argument("--peak-report", action="store_true",
                 help="dump each variant's compiled step (XLA_FLAGS "
                 "--xla_dump_to) and write what is live at its memory peak "
                 "(experiments/peak_report) to OUT/peak_<model>_<run>_<i>_<variant>.txt; the "
                 "JSON row gets a 'peak_live' summary")
  p.add_argument("--profile", action="store_true",
                 help="run one more step under jax.profiler and add its device "
                 "time by kind of kernel (experiments/profile_summary) to the "
                 "row; printed per variant after the table (the trace itself "
                 "is deleted: take your own with jax.profiler.trace to keep one)")
  p.add_argument("--pipelined", type=int, default=4,
                 help="after the timed steps, run this many more dispatched back "
                 "to back (no wait for each loss) and report their mean as "
                 "'step ms, pipelined' (0: none)")
  p.add_argument("--compiler-options", action="append", metavar="NAME=VALUE,...",
                 help="XLA options for compiling the step (jax.jit's "
                 "compiler_options, both optimizers alike), e.g. "
                 "'xla_gpu_enable_command_buffer=', or 'scan' for "
                 "fj.SCAN_GPU_COMPILER_OPTIONS; repeat the flag to run "
                 "every variant under each set ('' for XLA's defaults)")
  p.add_argument("--compile-first", action="store_true",
                 help="lower and compile each step on the state's shapes "
                 "before the state is made (one GPU only), so that what "
                 "XLA's compile allocates (presumably its autotuner's "
                 "buffers) is not held beside the state: 'compile peak' is "
                 "then the compile's own, and the live peak the largest of "
                 "the compile's, the init's and the steps'")
  p.add_argument("--mosaic-tile", metavar="NAME",
                 help="a tile of experiments/probe_mosaic's CONFIGS (e.g. "
                 "m128n128t64s3x3) for every fused op with bf16 W and "
                 "states that it covers, instead of the default "
                 "(use_mosaic_tile); the row records it")
  p.add_argument("--timeout", type=int, default=900, help="seconds per variant")
  p.add_argument("--out", default="experiments/results",
                 help="directory for the JSON and peak reports")
  p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant
  p.add_argument("--table-from", nargs="+", metavar="FILE",
                 help="print the table of earlier runs (their JSON, or logs "
                 "with one JSON row per line) instead of measuring")
  a = p.parse_args(argv)
  if not a.table_from:
    # Imports jax without starting a backend: the parent holds no GPU memory.
    from forge_jax.models import llama  # pylint: disable=g-import-not-at-top
    if a.model not in llama.PRESETS:
      p.error(f"--model {a.model!r}: expected one of {sorted(llama.PRESETS)}")
    if a.steps < 1:
      p.error(f"--steps={a.steps} must be >= 1")
    if a.steps < 3 and not a.one:
      print(f"memory_llama: note: --steps={a.steps}: the step time is the "
            "median of the steps after the first two, and there are none, so "
            "it includes them (compile and warm-up): use it for memory only",
            file=sys.stderr)
    try:
      tokens = [int(v) for v in a.tokens.split(",")]
    except ValueError:
      tokens = [0]
    if any(t < 1 for t in tokens):
      p.error(f"--tokens {a.tokens!r}: expected comma-separated positive ints")
    for name, given, known in (("--optimizers", a.optimizers, OPTIMIZERS),
                               ("--layouts", a.layouts, LAYOUTS)):
      unknown = [v for v in given.split(",") if v not in known]
      if unknown:
        p.error(f"{name}: unknown {unknown}; expected from {list(known)}")
  if a.layers < 0:
    p.error(f"--layers={a.layers} must be >= 0 (0: all of the model's blocks)")
  if a.pipelined < 0:
    p.error(f"--pipelined={a.pipelined} must be >= 0 (0: no pipelined steps)")
  option_sets = a.compiler_options or [""]
  for i, text in enumerate(option_sets):
    try:
      if not parse_compiler_options(text):
        option_sets[i] = ""  # e.g. ' , ': XLA's defaults, labelled so
    except ValueError as e:
      p.error(f"--compiler-options: {e}")
  if a.compile_first and a.tp > 1:
    p.error("--compile-first needs --tp 1 (a sharded state's shardings are "
            "known only once it exists)")
  if a.one and len(option_sets) > 1:
    p.error("--one runs one variant: give --compiler-options once")
  if a.table_from:
    rows = [r for path in a.table_from
            for r in _runs.read_json_or_log(path, '{"model"')]
    print_table(rows)
    print_losses(rows)
    print_movements(rows)
    print_profiles(rows)
    return rows
  if a.mosaic_tile:
    try:
      mosaic_tile(a.mosaic_tile)
    except ValueError as e:
      p.error(f"--mosaic-tile: {e}")
  if a.one:
    t, opt, layout = a.one.split(":")
    tile = a.mosaic_tile if opt != "optax" else None  # optax has no kernel
    if tile:
      use_mosaic_tile(tile)
    row = run_one(a.model, int(t), opt, layout, a.steps, a.tp, a.attention,
                  a.logits_dtype, a.implementation, a.embedding, a.profile,
                  a.layers, a.movement, a.pipelined, option_sets[0],
                  a.compile_first)
    if tile:
      row["mosaic_tile"] = tile
    print("RESULT " + json.dumps(row))
    return None
  rows = []
  stamp = int(time.time())  # names this run's files
  # tokens, optimizers and layouts were checked above, before any variant.
  for t, opt, layout, options in itertools.product(
      tokens, a.optimizers.split(","), a.layouts.split(","), option_sets):
    cmd = [sys.executable, "-m", "experiments.memory_llama", "--model",
           a.model, "--steps", str(a.steps), "--tp", str(a.tp),
           "--attention", a.attention, "--logits-dtype", a.logits_dtype,
           "--implementation", a.implementation, "--embedding", a.embedding,
           "--layers", str(a.layers), "--pipelined", str(a.pipelined),
           "--compiler-options", options,
           *(["--movement"] if a.movement else []),
           *(["--compile-first"] if a.compile_first else []),
           *(["--mosaic-tile", a.mosaic_tile] if a.mosaic_tile else []),
           "--one", f"{t}:{opt}:{layout}"] + (["--profile"] if a.profile else [])
    variant = dict(model=a.model, tokens=t, optimizer=opt, layout=layout,
                   **({"n_layers": a.layers} if a.layers else {}),
                   tp=a.tp, attention=a.attention,
                   logits_dtype=a.logits_dtype,
                   implementation=None if opt == "optax" else a.implementation,
                   **({"compiler_options": options} if options else {}),
                   compile_first=a.compile_first,
                   **({"mosaic_tile": a.mosaic_tile}
                      if a.mosaic_tile and opt != "optax" else {}))
    env = child_env()
    dump = None
    if a.peak_report:
      dump = tempfile.mkdtemp(prefix="forge_jax_dump_")
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
                          " --xla_dump_hlo_module_re=jit_step").strip()
      # A step read from JAX's persistent cache is not compiled: no dump.
      env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True,
                            timeout=a.timeout, env=env)
      line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
      # The exception's own line, not jax's traceback-filtering note.
      err = [x for x in proc.stderr.strip().splitlines()
             if "Error" in x.split(":")[0] or "Exception" in x.split(":")[0]]
      row = (json.loads(line[-1][7:]) if line else dict(
          variant, error=crash_error(
              (err or proc.stderr.strip().splitlines() or ["?"])[-1][:300],
              proc.stdout)))
    except subprocess.TimeoutExpired as e:
      row = dict(variant, error=timeout_error(a.timeout, e.stdout))
    if dump is not None:
      if "error" not in row:
        name = f"{opt}_{layout}".replace("+", "-")  # a plain file name
        row["peak_live"] = write_peak_report(dump, os.path.join(
            a.out, f"peak_{a.model}_{stamp}_{len(rows)}_T{t}_{name}.txt"))
      shutil.rmtree(dump, ignore_errors=True)
    if row.get("step_lowerings", 1) != 1:  # rows before stop 42 lack it
      print(f"WARNING: {t}:{opt}:{layout} lowered its step "
            f"{row['step_lowerings']} times, not once", flush=True)
    rows.append(row)
    print(json.dumps(row), flush=True)
  print_table(rows)
  print_losses(rows)
  print_movements(rows)
  print_profiles(rows)
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, f"memory_{a.model}_{stamp}.json")
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)
  print(f"wrote {path}")
  return rows


if __name__ == "__main__":
  main()

"""Public entry point of the fused weight-gradient + optimizer-update op."""

from __future__ import annotations

from collections.abc import Sequence
import functools
from typing import Literal

import jax
# Imported for its side effect. On jax 0.11 the Pallas interpreter imports
# this module during its first call, and the module registers a config value
# that belongs to jax's tracing context; a step jitted before that call then
# misses its cache once and is traced and compiled a second time ("number of
# tracing context values differs: now 51 and before 50" under
# jax_explain_cache_misses). Importing it here keeps the context fixed.
try:
  import jax.experimental.pallas.fuser  # noqa: F401  pylint: disable=unused-import
except ImportError:  # a jax without it: nothing to keep fixed
  pass
import jax.numpy as jnp
import numpy as np

from pallas_kernels import quantization
from pallas_kernels.fused_dw import autotune
from pallas_kernels.fused_dw import kernel_mosaic
from pallas_kernels.fused_dw import kernel_triton
from pallas_kernels.fused_dw import reference
from pallas_kernels.fused_dw.kernel_mosaic import MosaicConfig
from pallas_kernels.fused_dw.kernel_triton import FusedDWConfig
from pallas_kernels.fused_dw.reference import fused_dw_update_reference

Implementation = Literal["xla", "triton", "mosaic", "auto"]
IMPLEMENTATIONS = ("xla", "triton", "mosaic", "auto")
_OPERAND_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def resolve_implementation(implementation: str | None) -> str:
  """``None`` or ``'auto'`` -> ``'auto'`` when computations go to a GPU, else
  ``'xla'`` (the reference); any other name is returned as it is.

  "Go to a GPU": the device set by ``jax.default_device(...)`` if any (so a
  block under ``jax.default_device(jax.devices('cpu')[0])`` on a GPU machine
  uses the reference), else the default backend. ``'auto'`` picks the
  kernel per op when it runs (:func:`select_kernel`): the Mosaic GPU kernel
  on a Hopper GPU where it covers the op, else the Triton kernel.

  Raises:
    ValueError: for a name other than ``'xla'``, ``'triton'``, ``'mosaic'``,
      ``'auto'`` or ``None``.
  """
  if implementation is None or implementation == "auto":
    return "auto" if _default_platform() == "gpu" else "xla"
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"implementation={implementation!r} must be one of "
        f"{IMPLEMENTATIONS} or None")
  return implementation


def _compute_capability() -> str | None:
  """The default GPU's compute capability ("9.0" on H100/H200), else None."""
  try:
    return str(jax.devices()[0].compute_capability)
  except (AttributeError, RuntimeError):
    return None


_MOSAIC_AUTO_MIN_JAX = (0, 11)
"""'auto' picks the Mosaic kernel only on jax versions where it has run
compiled on a GPU (the H200 runs jax 0.11.2; on 0.10 it is only lowered)."""


def _jax_version() -> tuple[int, ...]:
  return tuple(jax.__version_info__[:2])


def is_batched(x) -> bool:
  """Whether ``x`` is being traced with a ``jax.vmap`` batch axis."""
  try:
    from jax._src.interpreters import batching  # pylint: disable=g-import-not-at-top
  except ImportError:  # pragma: no cover
    return False
  return isinstance(x, batching.BatchTracer)


def select_kernel(x, dy, w, state, rule, seed, config=None, *,
                  interpret: bool = False,
                  compute_capability: str | None = None) -> str:
  """The kernel ``implementation='auto'`` runs for this op: ``'mosaic'`` or
  ``'triton'``.

  A ``MosaicConfig`` selects Mosaic (Hopper only; its scope refusals say
  why), a ``FusedDWConfig`` Triton. Without a config, Mosaic (TMA + wgmma) where
  all of these hold: not ``interpret``; a Hopper
  GPU (compute capability 9.x; ``compute_capability`` overrides the
  device's, for tests); jax >= 0.11 (where the kernel has run compiled;
  on 0.10 it is only lowered for CUDA in the tests); and the
  kernel covers the op with that config (bf16 x/dY, T/in/out divisible by
  its tile, folded moments only in fp32 or bf16 with a fold block of at
  least 8 columns that divides the sub-tile's epi_n (64 in the default
  tiles), on a jax whose Mosaic GPU lowers concatenate:
  ``kernel_mosaic.unsupported_reason``); and, for folded moments, an fp32
  W with at least as many 128×128 tiles as the GPU has multiprocessors.
  ``w`` and the states not batched by ``jax.vmap`` (the vmapped Mosaic op
  works on copies of W and its states; the Triton kernel stays in place;
  a ``jax.jit`` inside the vmap hides the batching from this check, and the
  op is then correct but not in place). Otherwise Triton.
  On the H200 the Mosaic kernel measured faster than the
  Triton kernel on every Llama-3.1-8B and Qwen3-14B linear shape at T=512,
  2048 and 8192 when several ops run in one jitted step (AdamW fp32 states,
  bf16 W with stochastic rounding and fp32 or bf16 states;
  ``experiments/results/h200_2026-12-01d``). With int8 states (bf16 W with
  stochastic rounding, AdamW, one op per call) and their own default tile it
  measured 0.477–0.489 ms against Triton's 0.650–0.665 at T=512, 0.884 against
  0.992 at T=2048, and 1.999 against 2.085 (4096→14336) but 2.088 against
  1.959 (14336→4096) at T=8192; the Llama-3.1-8B int8-moment step took
  126.7 ms at T=512 (``experiments/results/h200_2026-12-01e``; 173.4 ms on
  the Triton kernel in an earlier run, before other changes).
  fold_adam (l = 3) with fp32 W and fp32 folded moments measured 0.336–0.342
  ms on Mosaic against Triton's 0.423–0.431 at T=512, 0.587–0.607 against
  0.673–0.683 at T=2048 and 1.585–1.661 against 1.836–1.952 at T=8192
  (4096↔14336). With a bf16 W (stochastic rounding) and bf16 folded
  moments, Mosaic measured 0.478 / 0.787 / 1.722 ms against Triton's
  0.433 / 0.689 / 2.026 at T=512 / 2048 / 8192 (4096→14336), so a folded
  rule beside a bf16 W stays on Triton. A 60M Llama (fp32 W and folded
  moments, T=16384, widths 256–1536: 8 to 48 tiles of 128×128 for 132
  multiprocessors) trained 9% slower per step on Mosaic (50.4 against
  46.1 ms), so a folded rule whose W has fewer tiles than the GPU has
  multiprocessors stays on Triton too (``experiments/results/h200_2026-12-01f``;
  only these two regimes were measured).
  """
  if isinstance(config, MosaicConfig):  # the caller chose the kernel
    return "mosaic"
  if (interpret or isinstance(config, FusedDWConfig)
      or any(is_batched(a) for a in jax.tree.leaves((w, state)))):
    # Under vmap the Mosaic kernel runs on fresh buffers (a copy of W and
    # its states); the Triton kernel stays in place.
    return "triton"
  cc = compute_capability or _compute_capability()
  if not cc or not cc.startswith("9") or _jax_version() < _MOSAIC_AUTO_MIN_JAX:
    return "triton"
  if kernel_mosaic.fold_block(rule) > 1 and (
      w.dtype != jnp.float32 or _output_tiles(w) < kernel_mosaic.num_sms()):
    return "triton"  # folded moments: see the docstring
  if config is None:
    config = mosaic_default_config(x, dy, w, state, rule, seed)
  reason = kernel_mosaic.unsupported_reason(x, dy, w, tuple(state), rule, seed,
                                            config)
  return "triton" if reason else "mosaic"


def _output_tiles(w) -> int:
  """128×128 tiles of W, rounded up."""
  return -(-w.shape[0] // 128) * -(-w.shape[1] // 128)


def mosaic_default_config(x, dy, w, state, rule, seed,
                          interpret: bool = False) -> MosaicConfig:
  """``MosaicConfig.default`` for this op (its ``narrow`` and
  ``int8_states`` from W's and the states' dtypes); the one-warpgroup tile
  for folded moments (the ping-pong layout was not measured with them) and
  where the warp-specialized default does not fit (e.g. fp32 W beside an
  fp32 and an int8 state overflow its shared memory)."""
  state = tuple(state)
  int8 = quantization.any_quantized(state)
  kw = dict(interpret=interpret, int8_states=int8,
            narrow=not int8 and all(jnp.dtype(a.dtype).itemsize == 2
                                    for a in (w, *state)),
            warp_specialized=not kernel_mosaic.is_folded(rule))
  config = MosaicConfig.default(x.shape[0], *w.shape, **kw)
  if config.compute_wgs == 2 and kernel_mosaic.unsupported_reason(
      x, dy, w, state, rule, seed, config, interpret):
    config = MosaicConfig.default(x.shape[0], *w.shape,
                                  **{**kw, "warp_specialized": False})
  return config


def triton_min_block_n(rule, state) -> int:
  """The narrowest Triton tile (columns of W) for this rule and states: it
  must hold whole fold blocks (``rule.min_block_n``) and, for int8 states,
  whole quantization blocks of its state columns."""
  widen = rule.min_block_n // rule.state_cols(rule.min_block_n)
  return max(rule.min_block_n, quantization.BLOCK_SIZE * widen
             if quantization.any_quantized(state) else 16)


def _default_platform() -> str:
  device = jax.config.jax_default_device
  if device is None:
    return jax.default_backend()
  platform = device if isinstance(device, str) else device.platform
  return "gpu" if platform in ("gpu", "cuda", "rocm") else platform


def _require_gpu(impl: str, interpret: bool) -> None:
  if not interpret and jax.default_backend() != "gpu":
    raise RuntimeError(
        f"implementation={impl!r} needs a GPU backend (found "
        f"{jax.default_backend()!r}); pass interpret=True to run the kernel "
        "in interpret mode, or implementation='xla' for the reference")


def _check_args(x, dy, w, state, hparams, rule, seed):
  if x.ndim != 2:
    raise ValueError(f"x must be 2-D (T, in), got x.shape={x.shape}")
  if dy.ndim != 2:
    raise ValueError(f"dy must be 2-D (T, out), got dy.shape={dy.shape}")
  if x.shape[0] != dy.shape[0]:
    raise ValueError(
        f"x and dy must have the same number of tokens T, got "
        f"x.shape={x.shape} and dy.shape={dy.shape}")
  if w.shape != (x.shape[1], dy.shape[1]):
    raise ValueError(
        f"w must have shape (in, out)={(x.shape[1], dy.shape[1])} from x and dy,"
        f" got w.shape={w.shape}")
  for name, a in (("x", x), ("dy", dy)):
    if a.dtype not in _OPERAND_DTYPES:
      raise ValueError(f"{name}.dtype={a.dtype} must be float32 or bfloat16")
  if x.dtype != dy.dtype:
    raise ValueError(f"x.dtype={x.dtype} and dy.dtype={dy.dtype} must match")
  if w.dtype not in _OPERAND_DTYPES:
    raise ValueError(f"w.dtype={w.dtype} must be float32 or bfloat16")
  if seed is not None:
    if w.dtype != jnp.bfloat16:
      raise ValueError("seed (stochastic rounding) needs bfloat16 w, got "
                       f"w.dtype={w.dtype}")
    if jnp.ndim(seed) != 0 or not jnp.issubdtype(jnp.result_type(seed), jnp.integer):
      raise ValueError(f"seed must be an integer scalar, got {jnp.result_type(seed)}"
                       f"{list(jnp.shape(seed))}")
    if isinstance(seed, int) and not 0 <= seed < 2**32:
      raise ValueError(f"seed={seed} must be in [0, 2**32)")
  if len(state) != len(rule.state_names):
    raise ValueError(
        f"state must hold {len(rule.state_names)} arrays {rule.state_names} "
        f"for rule {rule.name!r}, got {len(state)}")
  state_shape = rule.state_shape(w.shape)
  for name, s in zip(rule.state_names, state):
    nonneg = name in rule.nonnegative_states
    if isinstance(s, quantization.QuantizedArray):
      want = quantization.scale_shape(state_shape, s.scale_transposed)
      if (s.codes.shape != state_shape or s.codes.dtype != jnp.int8
          or s.scale.shape != want or s.scale.dtype != jnp.float32):
        raise ValueError(
            f"state {name!r}: a QuantizedArray for w of shape {w.shape} needs "
            f"int8 codes of shape {state_shape} and float32 scales of shape "
            f"{want}, got "
            f"{s.codes.dtype}{list(s.codes.shape)} and "
            f"{s.scale.dtype}{list(s.scale.shape)}")
      if s.nonnegative != nonneg:
        raise ValueError(
            f"state {name!r} must be quantized with nonnegative={nonneg} for "
            f"rule {rule.name!r}, got nonnegative={s.nonnegative}")
      continue
    if (getattr(s, "shape", None) != state_shape
        or getattr(s, "dtype", None) not in _OPERAND_DTYPES):
      raise ValueError(
          f"state {name!r} must be float32 or bfloat16 of shape {state_shape}, or "
          f"a QuantizedArray, got {type(s).__name__} "
          f"{getattr(s, 'dtype', '')}{list(getattr(s, 'shape', ()))}")
  if hparams.shape != (rule.num_hyperparams,) or hparams.dtype != jnp.float32:
    raise ValueError(
        f"hparams must be float32 of shape ({rule.num_hyperparams},) "
        f"= [{', '.join(rule.hyperparam_names)}, count], got "
        f"{hparams.dtype}{list(hparams.shape)}")


def fused_dw_update(
    x: jax.Array,
    dy: jax.Array,
    w: jax.Array,
    state: Sequence[jax.Array],
    hparams: jax.Array,
    *,
    rule,
    implementation: str | None = None,
    config: FusedDWConfig | MosaicConfig | None = None,
    interpret: bool = False,
    seed: jax.Array | None = None,
    index_offset: tuple = (0, 0),
    index_width: int | None = None,
    in_place: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """Fused dW = xᵀ·dY and elementwise optimizer step (FORGE, arXiv 2606.22932).

  The gradient is computed one (block_m, block_n) tile at a time in fp32 and
  consumed by ``rule.update`` in registers; only the new weight and state are
  written (into the buffers of the old ones with ``in_place``, and by the
  Triton kernel, when those are donated).

  Args:
    x: layer inputs, (T, in), float32 or bfloat16.
    dy: output cotangents, (T, out), same dtype as ``x``.
    w: weights, (in, out), float32 or bfloat16 (updated in fp32, then
      rounded: stochastically when ``seed`` is given, else to nearest).
    state: optimizer state ordered like ``rule.state_names``, each of shape
      (in, out): float32, bfloat16 (rounded to nearest when written) or a
      ``quantization.QuantizedArray`` (int8 codes, one fp32 scale per 64
      elements of a row, ``nonnegative`` for ``rule.nonnegative_states``;
      scales (in, ceil(out / 64)), or (ceil(out / 64), in) with
      ``scale_transposed``, the Mosaic kernel's layout, which it then reads
      and writes with no transpose around it). Each is read, updated in fp32
      and written back in its own format and layout.
    hparams: float32 vector ``[*rule.hyperparam_names, count]`` (see
      ``ElementwiseRule.pack``); traced, so changing it does not recompile.
    rule: an ``ElementwiseRule`` (e.g. ``forge_jax.rules.ADAMW``). The
      kernels trace it once per (rule, config) and share that trace across
      calls, as ``jax.jit`` does: a rule must depend only on its arguments.
    implementation: ``'xla'`` (unfused reference), ``'triton'`` (Pallas
      Triton kernel; needs a GPU unless ``interpret``), ``'mosaic'`` (Pallas
      Mosaic GPU kernel, TMA + wgmma, Hopper; bf16 x/dY,
      T/in/out divisible by its tile, folded moments in fp32 or bf16 with
      a fold block of at least 8 columns dividing ``config.epi_n``,
      compiled on jax >= 0.11 (interpret mode on any); in
      place when compiled, not vmapped and ``in_place``: see
      :mod:`pallas_kernels.fused_dw.kernel_mosaic`), ``'auto'`` (one of the
      two kernels per op on a GPU: :func:`select_kernel`; the reference
      elsewhere) or ``None`` (the same as ``'auto'``).
    config: tile configuration of the kernel: a ``FusedDWConfig`` for
      ``'triton'`` (if None, the one recorded by
      ``pallas_kernels.fused_dw.autotune.autotune`` for this op (device,
      shapes, dtypes, rule, state formats), else ``FusedDWConfig.default``),
      a ``MosaicConfig`` for ``'mosaic'`` (default ``mosaic_default_config``).
    interpret: run the Pallas kernel in interpret mode (for CPU tests).
    seed: uint32 scalar for stochastic rounding of a bfloat16 ``w``: element
      (i, j) uses the bits ``precision.random_bits(seed, count, i * out + j)``,
      so the result does not depend on the tile size.
    index_offset: ``(row0, col0)``, integer scalars (may be traced): where
      this ``w`` sits inside a larger weight of which it is one shard (tensor
      parallelism); stochastic rounding then uses the global element index
      ``(row0 + i) * index_width + col0 + j``, so a sharded update rounds
      exactly like the unsharded one.
    index_width: the larger weight's number of columns (default ``out``).
    in_place: for the compiled Mosaic kernel: update ``w`` and ``state`` in
      their own buffers (no copy when the caller donates them). Pass True
      only when they are whole arguments of your jitted function (not
      slices of a larger array, e.g. inside a ``lax.scan`` over stacked
      weights) and the results replace them. With slices, XLA's GPU
      dynamic-slice fusion gave the aliased operand and result different
      addresses and the kernel read garbage in every pattern but one
      (see :mod:`pallas_kernels.fused_dw.kernel_mosaic`). False (the
      default): the kernel writes fresh outputs. The Triton kernel aliases
      its outputs to ``w`` and ``state`` either way (it reads and writes
      them through separate pointers; right in every pattern tried).

  Returns:
    ``(new_w, new_state)`` with the dtypes and shapes of ``w`` and ``state``.
    With T = 0 the gradient is zero and the step is still taken (AdamW then
    decays the moments and applies weight decay), as unfused.

  Raises:
    ValueError: on wrong shapes or dtypes, an unknown implementation, a
      ``config.block_n`` (per epilogue chunk) that is not a multiple of 64
      with int8 state or of the rule's fold block, a
      config of the other kernel, an op outside the Mosaic kernel's scope
      (the message says which condition), or an ``in_place`` that is not a
      bool.
    RuntimeError: for ``implementation='triton'`` or ``'mosaic'`` without a
      GPU and without ``interpret`` (for ``'mosaic'`` before any scope
      reason).
  """
  state = tuple(state)
  _check_args(x, dy, w, state, hparams, rule, seed)
  if len(index_offset) != 2:
    raise ValueError(f"index_offset must be a pair (row0, col0), got {index_offset!r}")
  for v in index_offset:
    if isinstance(v, (int, np.integer)):
      if not 0 <= v < 2**32:
        raise ValueError(f"index_offset={tuple(index_offset)} must hold "
                         "integers in [0, 2**32)")
    elif not jnp.issubdtype(jnp.result_type(v), jnp.integer) or jnp.ndim(v):
      raise ValueError(f"index_offset={index_offset!r} must hold integer "
                       "scalars (Python ints or traced integer arrays)")
  if index_width is not None:
    if not isinstance(index_width, (int, np.integer)) or isinstance(index_width, bool):
      raise ValueError(f"index_width must be a Python int (static), got "
                       f"{type(index_width).__name__}")
    if not w.shape[1] <= index_width < 2**32:
      raise ValueError(f"index_width={index_width} must be at least w's number "
                       f"of columns {w.shape[1]} and below 2**32")
  kernel_mosaic.check_in_place(in_place)
  impl = resolve_implementation(implementation)
  if impl == "auto":
    impl = select_kernel(x, dy, w, state, rule, seed, config,
                         interpret=interpret)
  if impl == "mosaic":
    # Checked before the empty-operand shortcut: 'mosaic' refuses what it
    # does not cover even where no kernel would run. No GPU (and no
    # interpret) is said first: it is the reason whatever the op.
    _require_gpu(impl, interpret)
    if config is None:
      config = mosaic_default_config(x, dy, w, state, rule, seed, interpret)
    if not isinstance(config, MosaicConfig):
      raise ValueError(f"implementation='mosaic' needs a MosaicConfig, got "
                       f"config={config!r}")
    reason = kernel_mosaic.unsupported_reason(x, dy, w, state, rule, seed,
                                              config, interpret)
    if reason:
      raise ValueError(f"implementation='mosaic': {reason}")
  if impl == "xla" or x.size == 0 or w.size == 0:
    # Empty operands (T = 0: dW = 0; or an empty W) need no kernel launch.
    return fused_dw_update_reference(x, dy, w, state, hparams, rule=rule,
                                     seed=seed, index_offset=index_offset,
                                     index_width=index_width)
  _require_gpu(impl, interpret)
  if impl == "mosaic":
    return _kernel_call(kernel_mosaic.fused_dw_update_mosaic, x, dy, w, state,
                        hparams, seed, index_offset, rule=rule, config=config,
                        interpret=interpret, index_width=index_width,
                        in_place=in_place)
  if config is not None and not isinstance(config, FusedDWConfig):
    raise ValueError(f"implementation='triton' needs a FusedDWConfig, got "
                     f"config={config!r}")
  quantized = quantization.any_quantized(state)
  min_block_n = triton_min_block_n(rule, state)
  if config is None:
    # A configuration tuned for this exact op (autotune.py), else the heuristic.
    config = autotune.lookup(autotune.cache_key(x, w, state, rule, seed is not None))
    if config is None or config.chunk_n % min_block_n:
      config = FusedDWConfig.default(x.shape[0], *w.shape, x.dtype,
                                     min_block_n=min_block_n,
                                     quantized=quantized)
  elif config.chunk_n % min_block_n:
    raise ValueError(
        (f"config.block_n={config.block_n}" if config.epilogue_split == 1 else
         f"config.block_n / config.epilogue_split = {config.chunk_n}")
        + f" must be a multiple of {min_block_n} for rule {rule.name!r}" + (
            " with int8 state (a tile must hold whole quantization blocks of "
            f"{quantization.BLOCK_SIZE} state columns)" if quantized else ""))
  return _kernel_call(kernel_triton.fused_dw_update_triton, x, dy, w, state,
                      hparams, seed, index_offset, rule=rule, config=config,
                      interpret=interpret, index_width=index_width)


def _kernel_call(kernel, x, dy, w, state, hparams, seed, index_offset, **static):
  """``kernel(...)`` through one ``jax.jit`` per static configuration.

  A model calls the same op many times (an unrolled Llama-3.1-8B: 224 fused
  projections of 4 shapes). Through a shared jitted function JAX traces and
  lowers the kernel once per module and emits calls to it (lowering a Mosaic
  kernel for CUDA takes ~0.6 s on a CPU core, a Triton kernel's lowering
  compiles it); XLA inlines the calls, so the custom calls and their
  operand/result aliasing are as before. Like any ``jax.jit``, the rule is
  traced once per static configuration: a rule must be a function of its
  arguments (a Python global it reads is read at the first trace). The seed
  and the offsets, used only for stochastic rounding, travel as uint32
  arguments (a Python int may exceed int32). A rule or config that cannot be
  hashed runs the kernel directly, unshared.
  """
  seeds = (None if seed is None else
           tuple(reference.as_uint32(v) for v in (seed, *index_offset)))
  key = tuple(sorted(static.items()))
  try:
    hash(key)
  except TypeError:
    return kernel(x, dy, w, tuple(state), hparams, seed=seed,
                  index_offset=index_offset, **static)
  return _jitted_kernel(kernel, key)(x, dy, w, tuple(state), hparams, seeds)


@functools.lru_cache(maxsize=256)
def _jitted_kernel(kernel, static_items):
  static = dict(static_items)

  def call(x, dy, w, state, hparams, seeds):
    seed, offset = (None, (0, 0)) if seeds is None else (seeds[0], seeds[1:])
    return kernel(x, dy, w, state, hparams, seed=seed, index_offset=offset,
                  **static)

  call.__name__ = call.__qualname__ = f"forge_{kernel.__name__}"
  return jax.jit(call)

"""Pallas Mosaic GPU kernel (Hopper: TMA + wgmma): dW = xᵀ·dY, optimizer in the epilogue.

The same op as :mod:`pallas_kernels.fused_dw.kernel_triton`, written for the
backend that JAX develops for Hopper: the token loop streams x and dY tiles
into shared memory with TMA (``plgpu.emit_pipeline``, ``max_concurrent_steps``
deep) and accumulates xᵀ·dY on the tensor cores with ``wgmma`` (x's tile is
fed transposed from shared memory, so x is never transposed in HBM). The
epilogue walks the (block_m, block_n) tile in (epi_m, epi_n) sub-tiles: W and
each state sub-tile arrive by TMA into a double (or triple) buffer, are
updated in registers by ``rule.update`` and leave by TMA into the same
place. The gradient tile never leaves registers.

Three layouts (:class:`MosaicConfig`): one warpgroup per CTA and tile
(``_kernel``); two compute warpgroups splitting a (block_m, 2·block_n) tile
beside a memory warpgroup that issues the token loop's loads
(``_kernel_ws``, "cooperative"); ping-pong (``_kernel_pp``): the two
compute warpgroups take alternate tiles through one ring of token stages, so
that one's token loop (tensor cores) overlaps the other's epilogue (HBM).
A fourth, one-warpgroup CTAs each applying the rule to its previous tile
between its next tile's token steps (``MosaicConfig.overlap``), was correct
and slower at every measured shape on the H200 and the H100 in three
versions, and was removed (``docs/results.md``, "Stop 41" and "Stop 47").

With ``in_place=True`` (compiled), W and the states are passed as Refs
(``run_state``), which ``pl.kernel`` aliases in and out: the update is in
place, as the Triton kernel's ``input_output_aliases`` make it. (Returning
fresh buffers instead costs a copy of W and every state when the caller
donates them: measured 0.35 ms at 4096×14336 with fp32 AdamW states, against
a 0.41 ms kernel at T=512.) Such a kernel reads and writes one buffer, so it
is right only where XLA gives the operand and the aliased result the same
address. XLA's GPU dynamic-slice fusion does not always: with W a slice of
a stack, it gave them different addresses and the kernel read garbage
whenever anything but a direct ``dynamic_slice`` -> kernel ->
``dynamic_update_slice`` of the same stack at the same index was in play
(``lax.scan`` collecting the new weights as its output; the slice written
into another array; an ``optimization_barrier`` between the slice and the
kernel, as ``jax.checkpoint`` puts one, or between the kernel and the
update; H200, jax 0.11.2, ``docs/results.md``, "Stop 22"). So ``in_place``
is False unless the caller knows W and the states are whole arguments whose
results replace them (``forge_jax``'s ForgeDense: unstacked layers in
``make_train_step``'s step called on arrays). The CPU interpreter does not take ``Ref`` operands, so
interpret mode writes fresh output buffers, and neither does ``pl.kernel``
under ``vmap`` (a batch of Refs), so a vmapped op runs the batch on fresh
buffers too.

Scope (checked by :func:`unsupported_reason`; the Triton kernel covers the
rest): bf16 x and dY, W fp32, or bf16 rounded to nearest or stochastically
(``seed``: the bits of :func:`reference.round_weight`, from the global element
index built from iotas in the kernel), fp32, bf16 or int8 states of an
elementwise rule, fp32 or bf16 folded moments of a rule with
``update_rows`` (FOAM, below), and T, in, out divisible by block_t,
block_m, block_n.

Folded moments (FOAM inside the kernel, ``forge_jax``'s ``FoldAdamRule``,
fold block B = 2**l of at least 8 columns, dividing epi_n (64 by default,
so l = 3 to 6 with the default tiles)): XLA transposes the
(in, out / B) states to (out / B, in) around the kernel, in fp32
(``_FOLDED_DTYPE``), so that the B-column blocks of a sub-tile's rows meet
one contiguous (epi_n / B, epi_m) TMA box whose row j holds block j's
moment for each of the epi_m rows. The epilogue slices the fp32 gradient
sub-tile into its (epi_m, B) blocks, sums each along its rows (within the
quad of threads that holds a row's 8 consecutive accumulator columns),
updates row j of each moment and puts the per-block directions back
together with a concatenate: ``rule.update_rows``, which is
``fold_adam_blocks``, the definition the optax transform uses. Only the
order of the B-element sums differs from the reference. Mosaic GPU finds no
layout for a 4-column slice of the accumulator (so l = 2 runs on Triton)
and jax 0.10's Mosaic GPU does not lower concatenate (the compiled kernel
is refused there). int8 folded moments run on Triton: a quantization block
of 64 folded columns spans 64·B columns of W, several sub-tiles. The
transposes move 16 bytes per folded element of an fp32 state (an fp32 read
and write each way; 12 for a bf16 one): at l = 3 with fp32 W and moments,
half as many bytes as W's own read and write; and still, with fp32 W, the op measured faster than
AdamW with fp32 states on this kernel at every Llama-3.1-8B MLP shape and T
(``experiments/results/h200_2026-12-01f``).

int8 states (``quantization.QuantizedArray``: codes plus one fp32 scale per
64 columns of a row): the epilogue sub-tile is 64 columns wide, one
quantization block per row. Its codes travel by TMA like W. Its scales, one
column of the (in, out / 64) scale array per sub-tile, cannot (a (64, 1)
fp32 box is narrower than TMA's 16-byte minimum, and Mosaic GPU neither
loads a strided column from HBM nor slices one out of a wider shared-memory
box on jax 0.11): the kernel takes the scales transposed, (out / 64, in), so
that a sub-tile's scales are one contiguous (1, 64) row, loaded by TMA and
stored back by plain stores. States stored in that layout
(``QuantizedArray.scale_transposed``, as ``ForgeDense`` keeps its moments)
go in and out as they are; others are transposed around the kernel by XLA
(4 bytes per 64 elements, each way; under ``lax.scan`` XLA was seen to
transpose whole layer stacks of them, stop 26). The 128×128 tile measured
slow with int8 states (1.29 ms at T=512, 4096→14336, against 0.47 for
64×128; presumably the decode and encode
do not fit in registers beside a 128×128 accumulator, not checked with a
profiler), hence their own :meth:`MosaicConfig.default`. Decoding and
encoding are ``quantization.dequantize_blocks`` / ``quantize_blocks`` per
row, in operations Mosaic GPU lowers (floor(y + 0.5) of y >= 0 as its
truncation, the same value): bitwise equal on finite values, except where
this jax's Mosaic GPU has no sqrt (0.10) and the non-negative code's square
root is x·rsqrt(x), up to an ulp away (a scale a few ulps off, rarely a code
one step off). A block holding inf or NaN decodes to inf or NaN as the
reference's does, possibly with other codes.

Rule arithmetic: the rule is traced once on tile-shaped avals; every equation
that depends on the hyperparameters only (bias corrections such as
``1 - b1**count``, whose ``pow`` Mosaic GPU does not lower) is evaluated
outside the kernel by XLA and passed in as scalars; the per-element equations
are replayed inside the kernel. The two paths therefore run the same
equations as :func:`rule.update` on the unfused gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import quantization
from pallas_kernels.fused_dw import tiling

try:  # Mosaic GPU Pallas (jax >= 0.5); absent builds only lose this backend.
  from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError:  # pragma: no cover
  plgpu = None

from jax._src.state.discharge import run_state as _run_state

try:
  from jax._src.pallas.mosaic_gpu.interpret import params as _interpret_params
except ImportError:  # pragma: no cover
  _interpret_params = None

try:
  from jax.extend import core as _core
  _Literal = _core.Literal
except (ImportError, AttributeError):  # pragma: no cover
  from jax import core as _core  # type: ignore
  _Literal = _core.Literal


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """Tile shape of the Mosaic GPU kernel.

  Attributes:
    block_m: rows of a W tile (the ``in`` axis): 64 or 128 (one warpgroup's
      wgmma accumulator).
    block_n: columns of a W tile (the ``out`` axis): a multiple of 64, ≤ 256.
    block_t: tokens per pipeline step: 64 or 128.
    max_concurrent_steps: depth of the TMA pipeline over tokens (at least 2
      with ping_pong).
    epi_m, epi_n: epilogue sub-tile (divides block_m, block_n; epi_m a
      multiple of 64).
    group_m: tile rows per L2 group of the 1-D grid ordering.
    early_epilogue: issue the TMA loads of the first two epilogue sub-tiles
      before the token loop (their latency hides behind the matmul; their
      buffers then occupy shared memory during it).
    transpose_x: pass xᵀ (in, T), transposed by XLA (one copy of x), so that
      wgmma reads x's tile K-major; False feeds x's (T, in) tile to wgmma
      through a transposed shared-memory view instead (no copy; not
      supported by the CPU interpreter).
    epi_slots: epilogue sub-tile buffers (2 to 4). With 2, the loads of
      sub-tile s+2 wait until the stores of sub-tile s have left shared
      memory; with 3, only until those of s-1 have (one more sub-tile of
      shared memory).
    epi_ahead: sub-tiles whose loads are in flight while one is computed
      (1 to epi_slots; the loads of sub-tile s+epi_ahead start when s's
      compute does, once the stores of sub-tile s+epi_ahead-epi_slots
      have left its slot).
    compute_wgs: 1: one warpgroup per CTA computes a (block_m, block_n) tile
      and then its epilogue (one CTA per tile). 2: warp-specialized and
      persistent: ``num_ctas`` CTAs loop over tiles of (block_m,
      2·block_n); a third warpgroup only issues the TMA loads of x and dY
      (running ahead into the next tile while the two compute warpgroups,
      one per half, run their epilogues), and each compute warpgroup loads
      the epilogue's first sub-tiles before its token loop.
    ping_pong: with compute_wgs=2: the two compute warpgroups take
      different (block_m, block_n) tiles, one after the other through one
      shared ring of token stages, so that one's token loop (tensor cores)
      runs while the other applies the rule to its previous tile (HBM):
      CUTLASS's ping-pong schedule (``_kernel_pp``). False: they split a
      (block_m, 2·block_n) tile and run the token loop and the epilogue at
      the same time ("cooperative").
    num_ctas: CTAs of the persistent grid (compute_wgs=2); default the
      device's multiprocessor count.
  """

  block_m: int = 128
  block_n: int = 128
  block_t: int = 64
  max_concurrent_steps: int = 3
  epi_m: int = 64
  epi_n: int = 64
  group_m: int = 8
  early_epilogue: bool = False
  transpose_x: bool = True
  epi_slots: int = 2
  epi_ahead: int = 2
  compute_wgs: int = 1
  ping_pong: bool = False
  num_ctas: int | None = None

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_t", "max_concurrent_steps",
                 "epi_m", "epi_n", "group_m", "epi_slots", "epi_ahead",
                 "compute_wgs"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"MosaicConfig.{name}={v!r} must be an int")
    if self.num_ctas is not None and (not isinstance(self.num_ctas, int)
                                      or isinstance(self.num_ctas, bool)):
      raise ValueError(f"MosaicConfig.num_ctas={self.num_ctas!r} must be an int or None")
    for name in ("early_epilogue", "transpose_x", "ping_pong"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"MosaicConfig.{name}={getattr(self, name)!r} must be a bool")
    if self.block_m not in (64, 128):
      raise ValueError(f"MosaicConfig.block_m={self.block_m} must be 64 or 128")
    if self.block_n % 64 or not 64 <= self.block_n <= 256:
      raise ValueError(
          f"MosaicConfig.block_n={self.block_n} must be a multiple of 64 in [64, 256]")
    if self.block_t not in (64, 128):
      raise ValueError(f"MosaicConfig.block_t={self.block_t} must be 64 or 128")
    if self.compute_wgs not in (1, 2):
      raise ValueError(f"MosaicConfig.compute_wgs={self.compute_wgs} must be 1 or 2")
    if self.ping_pong and self.compute_wgs != 2:
      raise ValueError("MosaicConfig.ping_pong=True needs compute_wgs=2 (its "
                       f"two compute warpgroups); got compute_wgs={self.compute_wgs}")
    if self.ping_pong and self.max_concurrent_steps < 2:
      # A warpgroup releases stage g-1 once stage g has arrived: one stage
      # would wait for itself.
      raise ValueError("MosaicConfig.ping_pong=True needs max_concurrent_steps "
                       f">= 2; got {self.max_concurrent_steps}")
    if self.num_ctas is not None and self.num_ctas < 1:
      raise ValueError(f"MosaicConfig.num_ctas={self.num_ctas} must be >= 1")
    if self.num_ctas is not None and self.compute_wgs == 1:
      # One warpgroup: one CTA per tile, no persistent grid to size.
      raise ValueError(f"MosaicConfig.num_ctas={self.num_ctas} needs "
                       "compute_wgs=2 (a persistent grid); compute_wgs=1 "
                       "runs one CTA per tile")
    if self.epi_slots not in (2, 3, 4):
      raise ValueError(f"MosaicConfig.epi_slots={self.epi_slots} must be 2, 3 or 4")
    if not 1 <= self.epi_ahead <= self.epi_slots:
      raise ValueError(f"MosaicConfig.epi_ahead={self.epi_ahead} must be in "
                       f"[1, epi_slots={self.epi_slots}]")
    for name in ("max_concurrent_steps", "group_m"):
      if getattr(self, name) < 1:
        raise ValueError(f"MosaicConfig.{name}={getattr(self, name)} must be >= 1")
    if (self.epi_m % 64 or self.block_m % self.epi_m
        or self.epi_n % 16 or self.block_n % self.epi_n):
      raise ValueError(
          f"MosaicConfig epilogue sub-tile ({self.epi_m}, {self.epi_n}) must divide "
          f"the tile ({self.block_m}, {self.block_n}), epi_m a multiple of 64 and "
          "epi_n of 16")


  @classmethod
  def default(cls, t: int, d_in: int, d_out: int,
              interpret: bool = False,
              int8_states: bool = False,
              warp_specialized: bool = True,
              narrow: bool = False) -> "MosaicConfig":
    """A configuration for this shape, from the H200 measurements below
    (``probe_mosaic``, 4096→14336, AdamW, each comparison from one run;
    ``docs/results.md``, stops 16 and 23).

    ``narrow``: W and every state are 2-byte (bf16). ``int8_states``: the
    states are int8. ``warp_specialized=False`` (and ``interpret``, whose
    CPU interpreter has neither transposed views nor a reliable
    warp-specialized run) keeps to the one-warpgroup tiles.

    Ping-pong (``compute_wgs=2, ping_pong=True``) where it measured faster,
    in and out divide by its tile and there are at least two tiles per
    multiprocessor (its persistent CTAs run their tiles' token loops one
    at a time, so with fewer tiles it would leave multiprocessors idle):

    * bf16 W and states from T=2048 on: 128×128 tiles, 4 stages and 64×32
      epilogue sub-tiles below T=8192 (T=2048: 0.506 against 0.626 ms for
      the one-warpgroup tile with W rounded to nearest, 0.579 against 0.703
      with stochastic rounding, both with 64×64 sub-tiles; stop 28, the
      scalars read once per tile, stochastic rounding, 64×32 against 64×64:
      0.534 against 0.567 ms at 4096→14336, 0.549 against 0.589 at
      14336→4096, 0.180 against 0.191 at 4096→4096; 64×16: 1.109; stop 29,
      AdamW's bias corrections as reciprocals: 0.500 at 4096→14336, against
      0.691 for 64×128 ping-pong tiles), x read through the transposed
      shared-memory view below T=4096 (stop 32, per op with XLA's transpose
      of x where there is one, W rounded stochastically, T=2048: 0.491
      against 0.505 ms at 4096→14336, 0.499 and 0.493 against 0.523 and
      0.533 at 14336→4096 in two runs, 0.160 against 0.178 at 4096→4096;
      at T=8192 the view was slower, below; T=4096 and 6144 were not
      measured, so they keep XLA's transpose), 5 stages, 64×32 sub-tiles
      and x transposed by XLA from T=8192 on (1.406 against 1.556 ms,
      nearest; the view, stop 32: 1.591 against 1.463 at 4096→14336,
      stochastic rounding);
    * int8 states from T=8192 on: 64×128 tiles, 5 stages (fp32 W: 1.983
      against 2.204 ms). Not below: at T=512 with bf16 W rounded
      stochastically it took 0.808 against 0.495 ms (with fp32 W, 0.469
      against 0.509 in one run and, with 4 stages, 0.488 against 0.473 in
      another), and at T=2048 with fp32 W 0.735 against 0.715;
    * fp32 W and states from T=8192 on: 128×128 tiles, 5 stages, 64×16
      sub-tiles (1.516 against 1.620 ms).

    One warpgroup per tile otherwise: fp32 W and states below T=8192,
    128×128×64 tiles with 3 stages, halved along an axis that 128 does not
    divide, x read through a transposed shared-memory view below T=2048 and
    transposed by XLA from there on (0.418 against 0.610 ms at T=512, 0.681
    against 0.635 at T=2048, equal at 8192) except for W of at most
    ``NARROW_OUT`` columns, whose x is always read through the view: XLA's
    transpose is a pass over x, comparable there to the kernel's own
    traffic (stop 25, same-run probes, 128×128 tiles, view against
    transposed: 4096→1024 at T=2048 0.063 against 0.069 ms with fp32 W and
    states, 0.052 against 0.063 with bf16 W rounded stochastically and bf16
    states; 5120→1024 at T=8192 0.217 against 0.253 and 0.193 against
    0.242). Such W (fp32 or bf16 states) take ping-pong only with at least
    four of its tiles per multiprocessor, not two: 5120→1024 (320 tiles,
    2.4 per multiprocessor) with bf16 W and states took 0.085 ms on this
    tile against ping-pong's 0.102 at T=2048, and at T=8192 0.196 against
    0.227 for a 4-stage ping-pong tile (same probe; the 5-stage default
    was not in it and took 0.219 in the stop's table, another run); fp32,
    0.217 against 0.216 at T=8192 (wider inputs, with more tiles, were not
    measured). int8 states, 64×128 tiles with
    4 stages (64×64 where 128 does not divide out; 0.470 ms at T=512
    against 1.293 for 128×128: the decode and encode do not fit in
    registers beside a 128×128 accumulator, presumably); bf16 below T=2048:
    at T=512 the same-run probe (W rounded to nearest) had the two level
    (ping-pong 0.276 against 0.286 ms), and with stochastic rounding
    ping-pong took 0.460 ms in one run against the one-warpgroup tile's
    0.321 in another, so the one-warpgroup tile stays."""
    pp = warp_specialized and not interpret

    def enough(bm, bn, per_sm=2):
      return (pp and d_in % bm == 0 and d_out % bn == 0
              and (d_in // bm) * (d_out // bn) >= per_sm * num_sms())
    if int8_states:
      if t >= 8192 and enough(64, 128):
        return cls(block_m=64, block_n=128, max_concurrent_steps=5,
                   compute_wgs=2, ping_pong=True)
      return cls(block_m=64, block_n=128 if d_out % 128 == 0 else 64,
                 max_concurrent_steps=4)
    if enough(128, 128, 2 if d_out > NARROW_OUT else 4):
      if narrow and t >= 8192:
        return cls(max_concurrent_steps=5, epi_n=32, compute_wgs=2,
                   ping_pong=True)
      if narrow and t >= 2048:
        return cls(max_concurrent_steps=4, epi_n=32, compute_wgs=2,
                   ping_pong=True, transpose_x=t >= 4096)
      if not narrow and t >= 8192:
        return cls(max_concurrent_steps=5, epi_n=16, compute_wgs=2,
                   ping_pong=True)
    return cls(block_m=128 if d_in % 128 == 0 else 64,
               block_n=128 if d_out % 128 == 0 else 64,
               transpose_x=interpret or (t >= 2048 and d_out > NARROW_OUT))


def cta_block_n(config: MosaicConfig) -> int:
  """Columns of W one CTA's token loop covers at a time: 2·block_n for the
  cooperative warp-specialized layout, else block_n."""
  return config.block_n * (config.compute_wgs if not config.ping_pong else 1)


NARROW_OUT = 1024
"""W with at most this many columns (the K and V projections of Llama-3.1-8B
and Qwen3-14B), with fp32 or bf16 states, reads x through a transposed
shared-memory view on the one-warpgroup tile at every T, and takes ping-pong
only with at least four tiles per multiprocessor (``MosaicConfig.default``)."""


SMEM_BYTES = 227 * 1024
"""Shared memory a CTA may use on Hopper (H100/H200)."""


def smem_bytes(config: MosaicConfig, array_dtypes, operand_dtype=jnp.bfloat16,
               num_scale_arrays: int = 0, fold_block: int = 1) -> int:
  """Shared memory of one CTA, an upper bound: the token pipeline's stages
  plus the epilogue buffers (one per W/state array and slot, per compute
  warpgroup; ``array_dtypes`` = W's, then the states'; a folded state
  (``fold_block`` > 1) takes epi_n / fold_block columns; an int8 state's
  scales take an (epi_m,) fp32 row per slot,
  counted by ``num_scale_arrays``); both at once when they coexist
  (early_epilogue, or compute_wgs=2); plus ``SMEM_SLACK``. Mosaic GPU
  allocates fewer stages when T has fewer token steps than
  ``max_concurrent_steps``."""
  op = jnp.dtype(operand_dtype).itemsize
  cta_n = cta_block_n(config)
  stages = config.max_concurrent_steps * config.block_t * (
      config.block_m + cta_n) * op
  w_dtype, *state_dtypes = array_dtypes
  per_slot = config.epi_m * (
      config.epi_n * jnp.dtype(w_dtype).itemsize
      + config.epi_n // fold_block * sum(jnp.dtype(d).itemsize
                                         for d in state_dtypes)
      + num_scale_arrays * 4)
  epilogue = config.compute_wgs * config.epi_slots * per_slot
  slack = SMEM_SLACK if num_scale_arrays or fold_block > 1 else SMEM_SLACK_TILES
  if config.early_epilogue or config.compute_wgs == 2:
    return stages + epilogue + slack
  return max(stages, epilogue) + slack


SMEM_SLACK = 4096
"""Bytes :func:`smem_bytes` adds to its buffer count for barriers, alignment
and scratch where int8 states' scale rows are among the buffers or the
moments are folded: lowered on jax 0.11.2, Mosaic GPU allocated up to 2,272
bytes more than the buffers with int8 states (warp-specialized; the count
alone had let a tile 1,248 bytes over a CTA's limit through to a lowering
error) and 2,240–2,384 more with folded moments and two compute
warpgroups (2,048 of them reduction scratch)."""
SMEM_SLACK_TILES = 1024
"""The same for fp32/bf16 states: Mosaic GPU allocated 72–288 bytes more
than the buffers (jax 0.11.2; the most with the ping-pong layout)."""
MAX_BARRIERS = 32
"""Barriers Mosaic GPU initializes per allocation (jax 0.10–0.11)."""


MIN_FOLD_BLOCK = 8
"""The narrowest fold block (2**l columns) the kernel's epilogue sums: a
block is summed within the four threads of a quad that hold a row's 8
consecutive accumulator columns; Mosaic GPU's layout inference finds no
layout for a 4-column slice of the wgmma accumulator (jax 0.11.2)."""


def is_folded(rule) -> bool:
  """Whether ``rule`` keeps folded moments in the kernel's form (it has
  ``update_rows``, e.g. ``forge_jax``'s ``FoldAdamRule``)."""
  return callable(getattr(rule, "update_rows", None))


def fold_block(rule) -> int:
  """2**l for a folded-moment rule (:func:`is_folded`), else 1."""
  return int(rule.block) if is_folded(rule) else 1


def unsupported_reason(x, dy, w, state, rule, seed, config: MosaicConfig,
                       interpret: bool = False) -> str | None:
  """Why this op cannot run on the Mosaic kernel, or None if it can."""
  if plgpu is None:
    return "this jax has no Mosaic GPU Pallas"
  if x.dtype != jnp.bfloat16 or dy.dtype != jnp.bfloat16:
    return f"x and dy must be bfloat16 (got {x.dtype}, {dy.dtype})"
  if interpret and not config.transpose_x:
    return ("transpose_x=False (a transposed shared-memory view) is not "
            "supported by the CPU interpreter")
  if interpret and config.compute_wgs == 2:
    return ("compute_wgs=2 is not run in interpret mode (the CPU interpreter "
            "deadlocked intermittently on the warp-specialized layout; it is "
            "tested compiled on the GPU)")
  num_scale_arrays = sum(isinstance(s, quantization.QuantizedArray)
                         for s in state)
  if num_scale_arrays and config.epi_n != quantization.BLOCK_SIZE:
    return (f"int8 states need epi_n = {quantization.BLOCK_SIZE} (one "
            f"quantization block per sub-tile row); got epi_n={config.epi_n}")
  fold = fold_block(rule)
  if is_folded(rule):
    if not interpret and not _lowers(lax.concatenate_p):
      return (f"rule {rule.name!r}: this jax's Mosaic GPU does not lower "
              "concatenate, which the compiled folded epilogue needs (jax "
              ">= 0.11 lowers it; interpret mode runs on any jax; "
              "implementation='triton' or 'auto' runs folded moments on the "
              "Triton kernel)")
    if num_scale_arrays:
      return (f"rule {rule.name!r}: int8 folded moments run on the Triton "
              "kernel (a quantization block of folded columns spans "
              "several epilogue sub-tiles)")
    if fold < MIN_FOLD_BLOCK or config.epi_n % fold:
      return (f"rule {rule.name!r}: the fold block {fold} must be at least "
              f"{MIN_FOLD_BLOCK} and divide epi_n={config.epi_n} "
              "(smaller fold levels run on the Triton kernel)")
  elif (not callable(getattr(rule, "update", None))
        or rule.state_cols(config.block_n) != config.block_n):
    return (f"rule {rule.name!r} is neither elementwise nor a folded rule "
            "with update_rows")
  t, d_in = x.shape
  d_out = dy.shape[1]
  cta_n = cta_block_n(config)
  if t % config.block_t or d_in % config.block_m or d_out % cta_n:
    what = "block_n" if cta_n == config.block_n else "block_n·compute_wgs"
    return (f"T, in, out = {t}, {d_in}, {d_out} must divide by block_t, "
            f"block_m, {what} = {config.block_t}, {config.block_m}, {cta_n}")
  n_arr = len(_layout(state, fold).is_scale)  # W, each state, each scale row
  barriers = config.compute_wgs * config.epi_slots * n_arr
  if barriers > MAX_BARRIERS:
    return (f"the epilogue needs {barriers} barriers in one allocation "
            f"(compute warpgroups × epi_slots × arrays = {config.compute_wgs} "
            f"× {config.epi_slots} × {n_arr}), more than the {MAX_BARRIERS} "
            "Mosaic GPU allocates at once (fewer epi_slots)")
  if config.ping_pong and 2 * config.max_concurrent_steps > MAX_BARRIERS:
    return (f"max_concurrent_steps={config.max_concurrent_steps}: the "
            f"ping-pong ring needs 2 barriers per stage, at most {MAX_BARRIERS}")
  need = _smem_need(x, w, state, rule, config)
  if need > SMEM_BYTES:
    return (f"the tile needs about {need} bytes of shared memory, more than "
            f"the {SMEM_BYTES} of a Hopper CTA (fewer max_concurrent_steps, "
            "or a smaller epi_n)")
  return None


def _smem_need(x, w, state, rule, config: MosaicConfig) -> int:
  """:func:`smem_bytes` of this op's arrays."""
  fold = fold_block(rule)
  tiles = [w.dtype] + [jnp.float32 if fold > 1 else  # see _FOLDED_DTYPE
                       quantization.state_storage_dtype(s) for s in state]
  num_scale_arrays = sum(isinstance(s, quantization.QuantizedArray)
                         for s in state)
  return smem_bytes(config, tiles, x.dtype, num_scale_arrays=num_scale_arrays,
                    fold_block=fold)


# --- the rule, split into scalar (XLA) and per-element (kernel) equations ---


@dataclasses.dataclass(frozen=True)
class _SplitRule:
  # the rule traced on tiles: (grad, w, *state[, rows, cols], hp[, seeds])
  jaxpr: Any
  hoisted: tuple             # equations of the hyperparameters only
  in_kernel: tuple           # the other equations
  scalars: tuple             # hoisted variables that the kernel reads
  num_scalar_inputs: int     # trailing invars on the scalar side (hp, seeds)


def _split_rule(rule, tile_shape: tuple[int, int],
                round_to=None, index_width: int = 0) -> _SplitRule:
  """Traces the rule on tiles (nested jits inlined) and splits its equations.

  With ``round_to`` (bf16: stochastic rounding of the new W), the traced
  function also takes the tile's global row and column indices (uint32
  tiles, before the shard offset) and a uint32 vector ``[seed, row0, col0]``,
  and rounds as :func:`reference.round_weight` does: the key derived from
  seed and count is hoisted, the per-element hash stays in the kernel.

  Not cached: a rule is traced again for every traced op (cheap), so a rule
  that reads mutable state, or an unhashable one, behaves as in the other
  implementations."""
  from pallas_kernels.fused_dw import reference  # pylint: disable=g-import-not-at-top
  n = len(rule.state_names)
  sr = round_to is not None
  fold = fold_block(rule)
  k = tile_shape[1] // fold  # state rows per state of a folded rule
  num_state = n * k if fold > 1 else n

  def update(grad, w, *rest):
    state, rest = rest[:num_state], rest[num_state:]
    if sr:
      rows, cols, hp_vec, seeds = rest
    else:
      (hp_vec,) = rest
    hp, count = rule.unpack(hp_vec)
    if fold > 1:  # each state as k rows of its transpose (update_rows)
      new_w, new_rows = rule.update_rows(
          grad, w, tuple(tuple(state[i * k:(i + 1) * k]) for i in range(n)),
          hp, count)
      new_state = [v for r in new_rows for v in r]
    else:
      new_w, new_state = rule.update(grad, w, tuple(state), hp, count)
    if sr:
      index = (rows + seeds[1]) * jnp.uint32(index_width) + (cols + seeds[2])
      new_w = reference.round_weight(new_w, round_to, seeds[0], count, index)
    return (new_w, *new_state)

  tile = jax.ShapeDtypeStruct(tile_shape, jnp.float32)
  state_aval = (jax.ShapeDtypeStruct(tile_shape[:1], jnp.float32) if fold > 1
                else tile)
  avals = [tile, tile, *([state_aval] * num_state)]
  if sr:
    avals += [jax.ShapeDtypeStruct(tile_shape, jnp.uint32)] * 2
  avals.append(jax.ShapeDtypeStruct((rule.num_hyperparams,), jnp.float32))
  if sr:
    avals.append(jax.ShapeDtypeStruct((3,), jnp.uint32))
  nested = jax.make_jaxpr(update)(*avals)

  def flat(*args):  # the same equations with every nested jit inlined
    env = dict(zip(nested.jaxpr.constvars, nested.consts))
    env.update(zip(nested.jaxpr.invars, args))
    env = _eval_eqns(nested.jaxpr.eqns, env, inline=True)
    return [v.val if isinstance(v, _Literal) else env[v]
            for v in nested.jaxpr.outvars]

  closed = jax.make_jaxpr(flat)(*avals)
  if closed.consts:
    raise NotImplementedError(f"rule {rule.name!r} closes over array constants")
  jaxpr = closed.jaxpr
  num_scalar_inputs = 2 if sr else 1
  vectors = set(jaxpr.invars[-num_scalar_inputs:])
  scalar_side = set(vectors)
  hoisted, in_kernel = [], []
  for eqn in jaxpr.eqns:
    ins = [v for v in eqn.invars if not isinstance(v, _Literal)]
    if (all(v in scalar_side for v in ins)
        and all(o.aval.size == 1 for o in eqn.outvars)):
      hoisted.append(eqn)
      scalar_side.update(eqn.outvars)
    else:
      in_kernel.append(eqn)
  needed = []
  for v in [v for e in in_kernel for v in e.invars] + list(jaxpr.outvars):
    if not isinstance(v, _Literal) and v in scalar_side and v not in needed:
      if v in vectors:
        raise NotImplementedError(
            f"rule {rule.name!r} uses the packed hyperparameter vector per element")
      needed.append(v)
  return _SplitRule(jaxpr, tuple(hoisted), tuple(in_kernel), tuple(needed),
                    num_scalar_inputs)


def _sqrt_via_rsqrt(x, **params):
  """sqrt(x) as x·rsqrt(x), for Mosaic GPU builds without sqrt: 0 at 0, inf
  at inf, NaN below 0 and at NaN, as sqrt."""
  del params
  root = jnp.where(x > 0, x * lax.rsqrt(x), jnp.where(x == 0, x, jnp.nan))
  return jnp.where(x == jnp.inf, x, root)


def _select_n_broadcast(pred, *cases, **params):
  """select_n with a scalar predicate and tile cases (RAdam's switch):
  Mosaic GPU's warpgroup lowering has no implicit broadcast, so the
  predicate is broadcast first."""
  del params
  shape = jnp.shape(cases[0])
  if shape and not jnp.shape(pred):
    pred = lax.broadcast_in_dim(pred, shape, ())
  return lax.select_n(pred, *cases)


def _wg_lowering_rules():
  """This jax's Mosaic GPU lowering rules in warpgroup semantics, or None."""
  try:
    from jax._src.pallas.mosaic_gpu import core as gpu_core  # pylint: disable=g-import-not-at-top
    from jax._src.pallas.mosaic_gpu import lowering  # pylint: disable=g-import-not-at-top
    return lowering.mosaic_lowering_rules[gpu_core.WGxWG_SEMANTICS]
  except (ImportError, AttributeError, KeyError):  # pragma: no cover
    return None


def _lowers(primitive) -> bool:
  rules = _wg_lowering_rules()
  return rules is not None and primitive in rules


def _missing_lowerings() -> dict:
  """Replacements for primitives this jax's Mosaic GPU cannot lower."""
  replace = {lax.select_n_p: _select_n_broadcast}
  rules = _wg_lowering_rules()
  if rules is not None and lax.sqrt_p not in rules:
    replace[lax.sqrt_p] = _sqrt_via_rsqrt
  return replace


def _eval_eqns(eqns, env, replace=None, inline=None):
  """Binds ``eqns`` over ``env``; ``replace`` maps primitives to stand-ins,
  and nested jits are inlined (so that replacements reach inside) when
  ``replace`` is given or ``inline``."""
  replace = replace or {}
  inline = bool(replace) if inline is None else inline
  def read(v):
    return v.val if isinstance(v, _Literal) else env[v]
  for eqn in eqns:
    inner = eqn.params.get("jaxpr") if eqn.primitive.name in ("pjit", "jit") else None
    if inner is not None and inline:
      # Inlined, so that the replacements reach the equations inside.
      sub = dict(zip(inner.jaxpr.constvars, inner.consts))
      sub.update(zip(inner.jaxpr.invars, map(read, eqn.invars)))
      sub = _eval_eqns(inner.jaxpr.eqns, sub, replace, inline)
      env.update(zip(eqn.outvars, [
          v.val if isinstance(v, _Literal) else sub[v]
          for v in inner.jaxpr.outvars]))
      continue
    if eqn.primitive in replace:
      env[eqn.outvars[0]] = replace[eqn.primitive](
          *map(read, eqn.invars), **eqn.params)
      continue
    outs = eqn.primitive.bind(*map(read, eqn.invars), **eqn.params)
    if not eqn.primitive.multiple_results:
      outs = (outs,)
    env.update(zip(eqn.outvars, outs))
  return env


def _is_int32(dtype) -> bool:
  return (jnp.issubdtype(dtype, jnp.integer) and dtype != jnp.bool_
          and jnp.dtype(dtype).itemsize == 4)


def _to_f32_slots(v) -> list:
  """A hoisted scalar as entries of the fp32 vector: floats converted,
  predicates as 0/1, 32-bit integers as two exact 16-bit halves (high, low):
  Mosaic GPU does not lower a scalar bitcast, but it lowers scalar
  float-to-integer conversions, shifts and ors."""
  if v.dtype == jnp.bool_ or jnp.issubdtype(v.dtype, jnp.floating):
    return [v.astype(jnp.float32)]
  if _is_int32(v.dtype):
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    return [(bits >> 16).astype(jnp.float32),
            (bits & jnp.uint32(0xFFFF)).astype(jnp.float32)]
  raise NotImplementedError(
      f"a hyperparameter-only value of dtype {v.dtype} cannot be passed to the "
      "Mosaic kernel (fp32, bool and 32-bit integers can)")


def rule_scalars(rule, hparams, tile_shape) -> jax.Array:
  """The rule's hyperparameter-only quantities for one step (fp32 vector;
  predicates as 0/1, cast back in the kernel)."""
  return _hoisted_scalars(_split_rule(rule, tile_shape), hparams)


def _hoisted_scalars(split: _SplitRule, hparams, seeds=None) -> jax.Array:
  """The fp32 vector the kernel reads; ``seeds`` = uint32 [seed, row0,
  col0] when the split rounds stochastically."""
  inputs = (hparams,) if split.num_scalar_inputs == 1 else (hparams, seeds)
  env = _eval_eqns(split.hoisted, dict(zip(
      split.jaxpr.invars[-split.num_scalar_inputs:], inputs)))
  vals = [x for v in split.scalars for x in _to_f32_slots(jnp.reshape(env[v], ()))]
  return jnp.stack(vals + [jnp.zeros((), jnp.float32)])  # never empty


def _rule_in_kernel(split: _SplitRule, scalar_ref, grad, w, state,
                    replace=None, index_tiles=()):
  """The per-element equations on tiles; ``scalar_ref`` holds
  :func:`rule_scalars` (a kernel ref, the values already read from it as a
  list (:data:`SCALARS_AT`), or an array in tests);
  ``index_tiles`` the (rows, cols) uint32 tiles of a rounding split."""
  jaxpr = split.jaxpr
  env = dict(zip(jaxpr.invars[:-split.num_scalar_inputs],
                 (grad, w, *state, *index_tiles)))
  i = 0
  for v in split.scalars:
    value = scalar_ref[i]  # fp32; predicates travel as 0/1
    i += 1
    if v.aval.dtype == jnp.bool_:
      value = value != 0
    elif _is_int32(v.aval.dtype):  # two 16-bit halves, see _to_f32_slots
      dt = v.aval.dtype  # the shift and or are bitwise in int32 and uint32
      value = (value.astype(dt) << dt.type(16)) | scalar_ref[i].astype(dt)
      i += 1
    elif v.aval.dtype != jnp.float32:
      value = value.astype(v.aval.dtype)
    env[v] = jnp.reshape(value, v.aval.shape) if v.aval.shape else value
  env = _eval_eqns(split.in_kernel, env,
                   _missing_lowerings() if replace is None else replace)
  outs = [v.val if isinstance(v, _Literal) else env[v] for v in jaxpr.outvars]
  return outs[0], tuple(outs[1:])


# --- the kernel ---


def _smem_transforms(minor: int, dtype):
  swizzle = plgpu.find_swizzle(minor * jnp.dtype(dtype).itemsize * 8)
  elems = swizzle // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


def _index_tiles(split: _SplitRule, shape, origin):
  """(rows, cols) uint32 tiles of W indices from ``origin`` (row, col of
  the sub-tile's first element), for a split that rounds stochastically."""
  if split.num_scalar_inputs == 1:
    return ()
  row0, col0 = origin
  rows = lax.broadcasted_iota(jnp.int32, shape, 0) + row0
  cols = lax.broadcasted_iota(jnp.int32, shape, 1) + col0
  return rows.astype(jnp.uint32), cols.astype(jnp.uint32)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where W and each state sit among the kernel's flat arrays: W is array
  0; a plain state is ``(index,)``, an int8 state ``(codes_index,
  scale_index, nonnegative)``; ``is_scale[a]`` marks scale arrays. With
  ``fold_block`` > 1 every (plain) state is folded and passed transposed,
  (out / fold_block, in)."""
  states: tuple
  is_scale: tuple
  fold_block: int = 1

  @property
  def tile_arrays(self) -> list:
    return [a for a, sc in enumerate(self.is_scale) if not sc]

  def kind(self, a: int) -> str:
    """'tile' (W, int8 codes, plain states), 'scale' or 'fold'."""
    if self.is_scale[a]:
      return "scale"
    return "fold" if a and self.fold_block > 1 else "tile"


def _layout(state, fold: int = 1) -> _Layout:
  states, is_scale = [], [False]
  for st in state:
    if isinstance(st, quantization.QuantizedArray):
      states.append((len(is_scale), len(is_scale) + 1, st.nonnegative))
      is_scale += [False, True]
    else:
      states.append((len(is_scale),))
      is_scale.append(False)
  return _Layout(tuple(states), tuple(is_scale), fold)


SCALARS_AT = "tile"
"""Where the kernel reads the rule's scalars (:func:`rule_scalars`, an HBM
vector) into registers: ``'sub'``: at each epilogue sub-tile; ``'tile'``:
once per tile, before its first sub-tile; ``'kernel'``: once per compute
warpgroup, before its tile loop (the ping-pong layout; elsewhere as
``'tile'``). A read after a barrier wait cannot be moved across it, so
``'sub'`` waits on a dependent global load per scalar per sub-tile. Stop 28
(H200, ``experiments/trace_mosaic``, AdamW, bf16 W rounded stochastically,
T=2048, 4096→14336, ms): ping-pong with 64×64 sub-tiles 0.577 ``'sub'``,
0.567 ``'tile'``, 0.604–0.606 ``'kernel'`` (its epilogue took 45 against 38
thousand cycles per tile: the scalars held through the token loop cost
registers); with 64×32 sub-tiles 0.627 ``'sub'``, 0.534 ``'tile'``; the
one-warpgroup int8 tile (64×128) 0.736 ``'sub'`` against 0.700 and at
T=512 0.496 against 0.451. A switch for those comparisons; set it before
the kernel is traced (the kernel's jit caches its lowering)."""


def _read_scalars(scalars, where: str):
  """The rule's scalars as loaded values where :data:`SCALARS_AT` reads them
  at ``where`` (``'tile'`` also stands for ``'kernel'`` in the layouts
  without a tile loop of their own); else unchanged (the ref, or values
  already read)."""
  if SCALARS_AT not in ("sub", "tile", "kernel"):
    raise ValueError(f"kernel_mosaic.SCALARS_AT={SCALARS_AT!r} must be 'sub', "
                     "'tile' or 'kernel'")
  wanted = (where,) if where == "kernel" else ("tile", "kernel")
  if isinstance(scalars, list) or SCALARS_AT not in wanted:
    return scalars
  return [scalars[k] for k in range(scalars.shape[0])]


def _epilogue(acc, *, subs, config: MosaicConfig, split, scalar_ref, bufs,
              out_refs, slot_ref, barrier, load_sub, origin,
              layout: _Layout):
  """Applies the rule to ``acc`` sub-tile by sub-tile (see the module doc).

  The first ``config.epi_ahead`` sub-tiles must already be loading; ``slot_ref(buf,
  slot)`` is this warpgroup's buffer of a slot, ``barrier(a, s)`` the
  barrier of array ``a`` for sub-tile ``s``, ``load_sub(s)`` starts its loads and
  ``origin(s)`` is the (row, col) in W of its first element. An int8
  state's codes travel like W; its scales (transposed, (blocks, in)) arrive
  as one (1, epi_m) row by TMA and leave by plain stores of that row.
  Returns with the stores issued; the caller waits for them.
  """
  em, en = config.epi_m, config.epi_n
  n_arr = len(bufs)
  tiles = layout.tile_arrays
  sqrt = _missing_lowerings().get(lax.sqrt_p, jnp.sqrt)
  fold_rows = en // layout.fold_block if layout.fold_block > 1 else 0
  # Sub-tile s+ahead is loaded while s is computed; its slot held sub-tile
  # s+ahead-slots, whose stores must have left shared memory first.
  ahead = config.epi_ahead
  pending_ok = config.epi_slots - ahead  # store groups that may stay in flight
  scalars = _read_scalars(scalar_ref, "tile")
  for s, (i, j) in enumerate(subs):
    slot = s % config.epi_slots
    for a in range(n_arr):
      plgpu.barrier_wait(barrier(a, s))
    row0, col0 = origin(s)
    here = lambda a: slot_ref(bufs[a], slot)  # noqa: E731
    w = here(0)[...].astype(jnp.float32)
    state = []
    for entry in layout.states:
      if fold_rows:  # row r: fold block r's moments of the sub-tile's rows
        state += [here(entry[0])[r, :].astype(jnp.float32)
                  for r in range(fold_rows)]
        continue
      values = here(entry[0])[...].astype(jnp.float32)
      if len(entry) == 3:
        values = quantization.dequantize_blocks(values, here(entry[1])[0, :],
                                                entry[2])
      state.append(values)
    grad = acc[i * em:(i + 1) * em, j * en:(j + 1) * en]
    new_w, new_state = _rule_in_kernel(
        split, scalars, grad, w, tuple(state),
        index_tiles=_index_tiles(split, (em, en), (row0, col0)))
    here(0)[...] = new_w.astype(bufs[0].dtype)
    if fold_rows:
      for i, entry in enumerate(layout.states):
        for r in range(fold_rows):
          here(entry[0])[r, :] = new_state[i * fold_rows + r].astype(
              bufs[entry[0]].dtype)
      new_state = ()
    for entry, v in zip(layout.states, new_state):
      if len(entry) == 3:
        v, scale = quantization.quantize_blocks(v, entry[2], sqrt)
        # The sub-tile's scales, straight to HBM (one contiguous row of
        # the transposed scales).
        out_refs[entry[1]][col0 // quantization.BLOCK_SIZE,
                           pl.ds(row0, em)] = scale
      here(entry[0])[...] = v.astype(bufs[entry[0]].dtype)
    plgpu.commit_smem()
    for a in tiles:
      # One bulk group per sub-tile (committed with its last array).
      plgpu.copy_smem_to_gmem(
          here(a), _sub_window(out_refs[a], (row0, col0), config, layout, a),
          commit_group=a == tiles[-1])
    if s + ahead < len(subs):
      plgpu.wait_smem_to_gmem(pending_ok, wait_read_only=True)
      load_sub(s + ahead)


def _sub_window(ref, origin, config: MosaicConfig, layout: _Layout, a: int):
  """The HBM window, in array ``a`` of ``layout`` (``ref``), of the epilogue
  sub-tile whose first W element is at ``origin`` (row, col): (epi_m,
  epi_n) of W or a state (kind ``'tile'``); for transposed scales (blocks,
  in) the (1, epi_m) row holding its scales (its 64 columns are one block;
  ``'scale'``); for a transposed folded state (out / fold, in) its
  (epi_n / fold, epi_m) rows (``'fold'``)."""
  row0, col0 = origin
  kind, fold = layout.kind(a), layout.fold_block
  if kind == "scale":
    return ref.at[pl.ds(col0 // quantization.BLOCK_SIZE, 1),
                  pl.ds(row0, config.epi_m)]
  if kind == "fold":
    return ref.at[pl.ds(col0 // fold, config.epi_n // fold),
                  pl.ds(row0, config.epi_m)]
  return ref.at[pl.ds(row0, config.epi_m), pl.ds(col0, config.epi_n)]


def _epilogue_buffers(in_refs, layout: _Layout, config: MosaicConfig, lead=()):
  """Shared-memory slots of the epilogue: a (em, en) tile per array, a
  (1, em) fp32 row per scale array, (en / fold, em) rows per folded state."""
  em, en = config.epi_m, config.epi_n
  slots = (*lead, config.epi_slots)
  bufs = []
  for a, r in enumerate(in_refs):
    kind = layout.kind(a)
    if kind == "scale":
      bufs.append(plgpu.SMEM((*slots, 1, em), jnp.float32))
    elif kind == "fold":
      bufs.append(plgpu.SMEM((*slots, en // layout.fold_block, em), r.dtype))
    else:
      bufs.append(plgpu.SMEM((*slots, em, en), r.dtype,
                             transforms=_smem_transforms(en, r.dtype)))
  return bufs


def _io_refs(refs, n_arr: int, in_place: bool):
  """(inputs, outputs) of W and the states: the same refs when in place."""
  if in_place:
    return refs[:n_arr], refs[:n_arr]
  return refs[:n_arr], refs[n_arr:2 * n_arr]


def _operands(x_ref, dy_ref, refs, config: MosaicConfig, layout: _Layout,
              in_place: bool):
  """What every layout starts from: (number of W/state arrays, their input
  and output refs, T, in, out, the epilogue's (row, col) sub-tile indices
  in a (block_m, block_n) tile)."""
  n_arr = len(layout.is_scale)
  in_refs, out_refs = _io_refs(refs, n_arr, in_place)
  t, d_in = x_ref.shape[::-1] if config.transpose_x else x_ref.shape
  subs = [(i, j) for i in range(config.block_m // config.epi_m)
          for j in range(config.block_n // config.epi_n)]
  return n_arr, in_refs, out_refs, t, d_in, dy_ref.shape[1], subs


def _kernel(x_ref, dy_ref, scalar_ref, *refs, config: MosaicConfig, split,
            layout: _Layout, grid_axis: str, in_place: bool):
  n_arr, in_refs, out_refs, t, d_in, d_out, subs = _operands(
      x_ref, dy_ref, refs, config, layout, in_place)
  bm, bn, bt = config.block_m, config.block_n, config.block_t
  em, en = config.epi_m, config.epi_n

  m_i, n_i = tiling.grouped_tile(lax.axis_index(grid_axis), d_in // bm,
                                 d_out // bn, config.group_m)
  slots = config.epi_slots

  def origin(s):
    return m_i * bm + subs[s][0] * em, n_i * bn + subs[s][1] * en

  def load_sub(bufs, barriers, s):
    for a, (ref, buf) in enumerate(zip(in_refs, bufs)):
      src = _sub_window(ref, origin(s), config, layout, a)
      plgpu.copy_gmem_to_smem(src, buf.at[s % slots],
                              barriers.at[slots * a + s % slots])

  def matmul():
    def acc_scope(acc_ref):
      def step(_, x_smem, dy_smem):
        a = x_smem if config.transpose_x else x_smem.transpose((1, 0))
        plgpu.wgmma(acc_ref, a, dy_smem)
        if config.max_concurrent_steps == 1:
          plgpu.wgmma_wait(0)
      delay = 1 if config.max_concurrent_steps > 1 else 0
      plgpu.emit_pipeline(
          step,
          grid=(t // bt,),
          in_specs=[
              plgpu.BlockSpec((bm, bt), lambda k: (m_i, k),
                              transforms=_smem_transforms(bt, x_ref.dtype),
                              delay_release=delay)
              if config.transpose_x else
              plgpu.BlockSpec((bt, bm), lambda k: (k, m_i),
                              transforms=_smem_transforms(bm, x_ref.dtype),
                              delay_release=delay),
              plgpu.BlockSpec((bt, bn), lambda k: (k, n_i),
                              transforms=_smem_transforms(bn, dy_ref.dtype),
                              delay_release=delay),
          ],
          max_concurrent_steps=config.max_concurrent_steps,
      )(x_ref, dy_ref)
      return acc_ref[...]
    return pl.run_scoped(acc_scope, plgpu.ACC((bm, bn), jnp.float32))

  def epilogue(acc, bufs, barriers, loaded: int):
    for s in range(loaded, min(config.epi_ahead, len(subs))):
      load_sub(bufs, barriers, s)
    _epilogue(acc, subs=subs, config=config, split=split, scalar_ref=scalar_ref,
              bufs=bufs, out_refs=out_refs,
              slot_ref=lambda buf, slot: buf.at[slot],
              barrier=lambda a, s: barriers.at[slots * a + s % slots],
              load_sub=functools.partial(load_sub, bufs, barriers),
              origin=origin, layout=layout)
    plgpu.wait_smem_to_gmem(0)

  scratch = dict(
      bufs=_epilogue_buffers(in_refs, layout, config),
      barriers=plgpu.Barrier(num_barriers=slots * n_arr))

  if config.early_epilogue:
    def scope(bufs, barriers):
      for s in range(min(config.epi_ahead, len(subs))):
        load_sub(bufs, barriers, s)
      epilogue(matmul(), bufs, barriers, loaded=config.epi_ahead)
    pl.run_scoped(scope, **scratch)
  else:
    with jax.named_scope("token_loop"):  # regions of a profiled run
      acc = matmul()
    with jax.named_scope("epilogue"):
      pl.run_scoped(lambda bufs, barriers: epilogue(acc, bufs, barriers, 0),
                    **scratch)


def _tile_grid(config: MosaicConfig, t: int, d_in: int, d_out: int):
  """(tile rows, tile columns, tiles, token steps per tile, stages) of the
  ping-pong layout, whose CTAs walk (block_m, block_n) tiles."""
  num_m, num_n = d_in // config.block_m, d_out // config.block_n
  return (num_m, num_n, num_m * num_n, t // config.block_t,
          config.max_concurrent_steps)


def _token_ring(x_ref, dy_ref, config: MosaicConfig) -> dict:
  """The ping-pong layout's ring of token stages (``max_concurrent_steps``
  of them): ``x_smem`` (an x tile per stage, (block_m, block_t) when XLA
  transposed x, else (block_t, block_m)) and ``dy_smem`` ((block_t,
  block_n) per stage)."""
  depth, bt, bn = config.max_concurrent_steps, config.block_t, config.block_n
  x_block = (config.block_m, bt) if config.transpose_x else (bt, config.block_m)
  return dict(
      x_smem=plgpu.SMEM((depth, *x_block), x_ref.dtype,
                        transforms=_smem_transforms(x_block[1], x_ref.dtype)),
      dy_smem=plgpu.SMEM((depth, bt, bn), dy_ref.dtype,
                         transforms=_smem_transforms(bn, dy_ref.dtype)))


def _kernel_ws(x_ref, dy_ref, scalar_ref, *refs, config: MosaicConfig, split,
               layout: _Layout, in_place: bool):
  """compute_wgs=2: persistent, warp-specialized (see MosaicConfig)."""
  n_arr, in_refs, out_refs, t, d_in, d_out, subs = _operands(
      x_ref, dy_ref, refs, config, layout, in_place)
  bm, bn, bt = config.block_m, config.block_n, config.block_t
  em, en = config.epi_m, config.epi_n
  cta_n = 2 * bn
  num_m, num_n = d_in // bm, d_out // cta_n
  slots = config.epi_slots

  x_spec = (plgpu.BlockSpec((bm, bt), lambda k: (0, k),
                            transforms=_smem_transforms(bt, x_ref.dtype))
            if config.transpose_x else
            plgpu.BlockSpec((bt, bm), lambda k: (k, 0),
                            transforms=_smem_transforms(bm, x_ref.dtype)))
  dy_spec = plgpu.BlockSpec((bt, cta_n), lambda k: (k, 0),
                            transforms=_smem_transforms(cta_n, dy_ref.dtype))

  def pipeline(body, context):
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(t // bt,), memory_registers=_MEMORY_REGISTERS,
        in_specs=[x_spec, dy_spec],
        wg_axis="wg", num_compute_wgs=2,
        max_concurrent_steps=config.max_concurrent_steps,
        compute_context=context)

  def x_cols(m_i):
    return (x_ref.at[pl.ds(m_i * bm, bm), :] if config.transpose_x
            else x_ref.at[:, pl.ds(m_i * bm, bm)])

  nothing = lambda *_, **__: None  # noqa: E731
  allocs = pipeline(nothing, nothing).get_allocations(
      x_cols(0), dy_ref.at[:, pl.ds(0, cta_n)])

  def scope(pipeline_allocs, bufs, barriers):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((num_m * num_n,), collective_axes="cta")
    def _tile_loop(info):
      (lin,) = info.index
      m_i, n_i = tiling.grouped_tile(lin, num_m, num_n, config.group_m)

      def barrier(a, s):
        return barriers.at[(wg * n_arr + a) * slots + s % slots]

      def origin(s):
        return (m_i * bm + subs[s][0] * em,
                n_i * cta_n + wg * bn + subs[s][1] * en)

      def load_sub(s):
        for a, (ref, buf) in enumerate(zip(in_refs, bufs)):
          src = _sub_window(ref, origin(s), config, layout, a)
          plgpu.copy_gmem_to_smem(src, buf.at[wg, s % slots], barrier(a, s))

      def context(eval_pipeline):
        for s in range(min(config.epi_ahead, len(subs))):
          load_sub(s)  # the epilogue's first sub-tiles arrive during the matmul

        def acc_scope(acc_ref):
          eval_pipeline(acc_ref)
          return acc_ref[...]
        acc = pl.run_scoped(acc_scope, plgpu.ACC((bm, bn), jnp.float32))
        _epilogue(acc, subs=subs, config=config, split=split,
                  scalar_ref=scalar_ref, bufs=bufs, out_refs=out_refs,
                  slot_ref=lambda buf, slot: buf.at[wg, slot], barrier=barrier,
                  load_sub=load_sub, origin=origin,
                  layout=layout)
        # The next tile's first loads reuse these buffers.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

      def body(_, x_smem, dy_smem, acc_ref):
        a = x_smem if config.transpose_x else x_smem.transpose((1, 0))
        plgpu.wgmma(acc_ref, a, dy_smem.at[:, pl.ds(wg * bn, bn)])
        plgpu.wgmma_wait(0)
        return acc_ref

      pipeline(body, context)(x_cols(m_i), dy_ref.at[:, pl.ds(n_i * cta_n, cta_n)],
                              allocations=pipeline_allocs)

  pl.run_scoped(
      scope,
      pipeline_allocs=allocs,
      bufs=_epilogue_buffers(in_refs, layout, config, lead=(2,)),
      barriers=plgpu.Barrier(num_barriers=2 * slots * n_arr),
      collective_axes="wg")
  plgpu.wait_smem_to_gmem(0)


def _kernel_pp(x_ref, dy_ref, scalar_ref, *refs, config: MosaicConfig, split,
               layout: _Layout, in_place: bool):
  """compute_wgs=2 with ping_pong: persistent, warp-specialized, ping-pong.

  Each CTA walks its share of the (block_m, block_n) tiles (tiles c, c + G,
  c + 2G, ... of the grouped order, G CTAs). A memory warpgroup streams the
  x and dY blocks of those tiles, one tile after the other, through one ring
  of ``max_concurrent_steps`` shared-memory stages; compute warpgroup 0 takes
  the CTA's even tiles, 1 its odd ones. Because the ring is shared and
  filled in tile order, one warpgroup's token loop runs while the other
  applies the rule to its previous tile: the tensor cores and the epilogue's
  HBM traffic overlap (CUTLASS's "ping-pong" schedule). Each stage's arrival
  is signalled on a barrier of the warpgroup that consumes it (so each
  warpgroup waits only on its own barriers, whose phases it tracks), and the
  consumer alone releases it."""
  n_arr, in_refs, out_refs, t, d_in, d_out, subs = _operands(
      x_ref, dy_ref, refs, config, layout, in_place)
  bm, bn, bt = config.block_m, config.block_n, config.block_t
  em, en = config.epi_m, config.epi_n
  num_m, num_n, num_tiles, steps, depth = _tile_grid(config, t, d_in, d_out)
  slots = config.epi_slots

  def scope(x_smem, dy_smem, produced, consumed, bufs, barriers):
    wg = lax.axis_index("wg")
    cta = lax.axis_index("cta")
    ctas = lax.axis_size("cta")
    local = (num_tiles - cta + ctas - 1) // ctas  # this CTA's tiles

    def tile(j):  # (row, column) of this CTA's j-th tile
      return tiling.grouped_tile(cta + j * ctas, num_m, num_n, config.group_m)

    @pl.when(wg == 2)
    def _memory():
      plgpu.set_max_registers(_MEMORY_REGISTERS, action="decrease")

      def tile_loads(j, carry):
        m_i, n_i = tile(j)

        def step(k, carry):
          g = j * steps + k
          slot = lax.rem(g, depth)

          @pl.when(g >= depth)
          def _():
            plgpu.barrier_wait(consumed.at[slot])
          bar = produced.at[lax.rem(j, 2) * depth + slot]
          src = (x_ref.at[pl.ds(m_i * bm, bm), pl.ds(k * bt, bt)]
                 if config.transpose_x else
                 x_ref.at[pl.ds(k * bt, bt), pl.ds(m_i * bm, bm)])
          plgpu.copy_gmem_to_smem(src, x_smem.at[slot], bar)
          plgpu.copy_gmem_to_smem(
              dy_ref.at[pl.ds(k * bt, bt), pl.ds(n_i * bn, bn)],
              dy_smem.at[slot], bar)
          return carry
        return lax.fori_loop(0, steps, step, carry)
      lax.fori_loop(0, local, tile_loads, None)

      # Every release waited for before the CTA's shared memory goes.
      total = local * steps
      def drain(g, carry):
        plgpu.barrier_wait(consumed.at[lax.rem(g, depth)])
        return carry
      lax.fori_loop(jnp.maximum(total - depth, 0), total, drain, None)

    @pl.when(wg < 2)
    def _compute():
      plgpu.set_max_registers(_COMPUTE_REGISTERS, action="increase")
      scalars = _read_scalars(scalar_ref, "kernel")

      def barrier(a, s):
        return barriers.at[(wg * n_arr + a) * slots + s % slots]

      def tile_body(i, carry):
        j = 2 * i + wg
        m_i, n_i = tile(j)

        def origin(s):
          return m_i * bm + subs[s][0] * em, n_i * bn + subs[s][1] * en

        def load_sub(s):
          for a, (ref, buf) in enumerate(zip(in_refs, bufs)):
            src = _sub_window(ref, origin(s), config, layout, a)
            plgpu.copy_gmem_to_smem(src, buf.at[wg, s % slots], barrier(a, s))

        for s in range(min(config.epi_ahead, len(subs))):
          load_sub(s)  # the epilogue's first sub-tiles arrive during the matmul

        def acc_scope(acc_ref):
          def step(k, carry):
            g = j * steps + k
            slot = lax.rem(g, depth)
            plgpu.barrier_wait(produced.at[wg * depth + slot])
            a = (x_smem.at[slot] if config.transpose_x
                 else x_smem.at[slot].transpose((1, 0)))
            plgpu.wgmma(acc_ref, a, dy_smem.at[slot])
            plgpu.wgmma_wait(1)  # the previous step's wgmma is done: release it

            @pl.when(k > 0)
            def _():
              plgpu.barrier_arrive(consumed.at[lax.rem(g - 1, depth)])
            return carry
          lax.fori_loop(0, steps, step, None)
          plgpu.wgmma_wait(0)
          plgpu.barrier_arrive(consumed.at[lax.rem(j * steps + steps - 1, depth)])
          return acc_ref[...]
        with jax.named_scope("token_loop"):  # regions of a profiled run
          acc = pl.run_scoped(acc_scope, plgpu.ACC((bm, bn), jnp.float32))
        with jax.named_scope("epilogue"):
          _epilogue(acc, subs=subs, config=config, split=split,
                    scalar_ref=scalars, bufs=bufs, out_refs=out_refs,
                    slot_ref=lambda buf, slot: buf.at[wg, slot], barrier=barrier,
                    load_sub=load_sub, origin=origin, layout=layout)
          # The next tile's first loads reuse these buffers.
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        return carry
      lax.fori_loop(0, (local - wg + 1) // 2, tile_body, None)
      plgpu.wait_smem_to_gmem(0)

  pl.run_scoped(
      scope,
      **_token_ring(x_ref, dy_ref, config),
      produced=plgpu.Barrier(num_arrivals=2, num_barriers=2 * depth),
      consumed=plgpu.Barrier(num_barriers=depth),
      bufs=_epilogue_buffers(in_refs, layout, config, lead=(2,)),
      barriers=plgpu.Barrier(num_barriers=2 * slots * n_arr),
      collective_axes="wg")


_MEMORY_REGISTERS = 40
"""Registers per thread of a warp-specialized kernel's memory warpgroup (the
value ``emit_pipeline_warp_specialized``'s documentation gives for H100)."""
_COMPUTE_REGISTERS = (512 - _MEMORY_REGISTERS) // 2 // 8 * 8
"""Per thread of each of the ping-pong kernel's two compute warpgroups: the
rest of the 64K-register file (512 per thread of one warpgroup), rounded
down to a multiple of 8 (232)."""


_PROFILE: dict = {}
"""Mosaic GPU profiler parameters of kernels lowered inside :func:`profiled`."""


@contextlib.contextmanager
def profiled(profile_dir: str, profile_space: int = 40):
  """Kernels lowered (traced and compiled) inside this context record, per
  warpgroup, the SM clock at the start and end of each ``token_loop`` and
  ``epilogue`` region (Mosaic GPU's on-device profiler) and write a
  Perfetto trace, ``<ns>-trace.json``, to ``profile_dir`` at every call.

  ``profile_space``: ranges recorded per warpgroup. Each tile records two
  (its token loop and its epilogue), so give at least twice the tiles per
  warpgroup, plus one; where this jax can bound-check (0.11) later ranges
  are dropped, elsewhere they overrun shared memory. The buffer takes 16
  bytes per range and warpgroup of shared memory, which the tile's budget
  must leave free. Only the one-warpgroup layout without
  ``early_epilogue`` and the ping-pong layout mark the regions. A function
  traced inside stays profiled after the context ends (jit caches its
  lowering). For diagnosis (``experiments/trace_mosaic``); GPU only.

  Raises:
    ValueError: if ``profile_space`` is not a positive int or
      ``profile_dir`` is empty.
  """
  if (not isinstance(profile_space, int) or isinstance(profile_space, bool)
      or profile_space < 1):
    raise ValueError(f"profile_space={profile_space!r} must be a positive int")
  if not profile_dir:
    raise ValueError("profile_dir must name a directory")
  params = dict(profile_space=profile_space, profile_dir=profile_dir)
  if "profile_bounds_check" in {f.name for f in
                                dataclasses.fields(plgpu.CompilerParams)}:
    params["profile_bounds_check"] = True  # jax >= 0.11
  old = dict(_PROFILE)
  _PROFILE.clear()
  _PROFILE.update(params)
  try:
    yield
  finally:
    _PROFILE.clear()
    _PROFILE.update(old)


def num_sms() -> int:
  """Multiprocessors of the first device (132 on an H100/H200 SXM; also
  when the device does not say, as on the CPU)."""
  try:
    return int(jax.devices()[0].core_count)
  except (AttributeError, TypeError, ValueError):
    return 132


def interpret_params():
  """Parameters that run the kernel in Mosaic GPU interpret mode (CPU)."""
  if _interpret_params is None:  # pragma: no cover
    raise RuntimeError("this jax has no Mosaic GPU interpret mode")
  return _interpret_params.InterpretGPUParams()


_FOLDED_DTYPE = jnp.float32
"""Folded states enter the kernel transposed, (out / 2**l, in), and in fp32:
XLA's transpose converts a bf16 state on the way in and rounds it to nearest
on the way out (the rounding the kernel would otherwise apply: the same
results), and the kernel reads and writes fp32 rows. Measured with bf16 W
(stochastic rounding) and bf16 folded moments, 4096→14336, in one run:
0.478 / 0.787 / 1.722 ms at T=512 / 2048 / 8192 with fp32 rows against
0.459 / 0.834 / 1.781 with bf16 rows; an earlier run of the bf16 rows gave
0.464 / 0.832 / 2.218, so the two are within run-to-run spread
(``experiments/results/h200_2026-12-01f/bench``)."""


def check_in_place(in_place) -> None:
  """Raises ValueError unless ``in_place`` is True or False."""
  if not isinstance(in_place, bool):
    raise ValueError(f"in_place={in_place!r} must be True or False")


def fused_dw_update_mosaic(x, dy, w, state, hparams, *, rule,
                           config: MosaicConfig, interpret: bool, seed=None,
                           index_offset=(0, 0), index_width=None,
                           in_place: bool = False):
  """Runs the kernel; arguments as :func:`pallas_kernels.fused_dw.fused_dw_update`.

  ``in_place``: W and the states are passed as Refs, aliased in and out, and
  updated where they are (compiled, not vmapped; see the module docstring
  and ``fused_dw_update``'s ``in_place`` for when that is safe). False: the
  kernel reads them and writes fresh outputs.

  Raises:
    ValueError: if :func:`unsupported_reason` names a reason.
  """
  state = tuple(state)
  reason = unsupported_reason(x, dy, w, state, rule, seed, config, interpret)
  if reason:
    raise ValueError(f"implementation='mosaic': {reason}")
  check_in_place(in_place)
  tile = (config.epi_m, config.epi_n)
  from pallas_kernels.fused_dw import reference  # pylint: disable=g-import-not-at-top
  sr = seed is not None  # the API allows a seed only with a bf16 W
  split = _split_rule(rule, tile, round_to=w.dtype if sr else None,
                      index_width=w.shape[1] if index_width is None else index_width)
  seeds = None
  if sr:  # as the Triton kernel: [seed, row0, col0] of this (shard of) W
    seeds = jnp.stack([reference.as_uint32(v) for v in (seed, *index_offset)])
  scalars = _hoisted_scalars(split, hparams, seeds)
  fold = fold_block(rule)
  layout = _layout(state, fold)
  arrays = [w]
  for st in state:  # an int8 state's scales go in transposed: (blocks, in)
    arrays += ([st.codes, quantization.with_scale_layout(st, True).scale]
               if isinstance(st, quantization.QuantizedArray)
               else [st.T.astype(_FOLDED_DTYPE) if fold > 1 else st])
  num_tiles = (w.shape[0] // config.block_m) * (w.shape[1] // config.block_n)
  params = plgpu.CompilerParams(
      lowering_semantics=plgpu.LoweringSemantics.Warpgroup, **_PROFILE)
  operands = (x.T if config.transpose_x else x, dy, scalars)
  if config.compute_wgs == 1:
    body = functools.partial(_kernel, config=config, split=split,
                             layout=layout, grid_axis="tile")
    mesh = dict(grid=(num_tiles,), grid_names=("tile",))
  elif config.ping_pong:
    # At least two tiles per CTA, one per compute warpgroup, where there are.
    ctas = config.num_ctas or num_sms()
    body = functools.partial(_kernel_pp, config=config, split=split,
                             layout=layout)
    mesh = dict(grid=(max(1, min(ctas, num_tiles // 2)),), grid_names=("cta",),
                num_threads=3, thread_name="wg")
  else:
    # num_tiles // 2 CTA tiles of (block_m, 2·block_n), shared out by nd_loop.
    ctas = config.num_ctas or (2 if interpret else num_sms())
    body = functools.partial(_kernel_ws, config=config, split=split,
                             layout=layout)
    mesh = dict(grid=(min(ctas, num_tiles // 2),), grid_names=("cta",),
                num_threads=3, thread_name="wg")
  name = f"forge_fused_dw_{rule.name}_mosaic"
  out_type = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]

  def fresh(*args):
    """Fresh output buffers (plgpu.kernel, which also batches under vmap):
    the body reads W and the states from inputs and writes separate outputs."""
    extra = {"interpret": interpret_params()} if interpret else {}
    return list(plgpu.kernel(functools.partial(body, in_place=False),
                             out_type=out_type, compiler_params=params,
                             kernel_name=name, **mesh, **extra)(*args))

  @jax.custom_batching.custom_vmap
  def aliased(*args):
    if interpret:  # the CPU interpreter takes no Ref operands
      return fresh(*args)
    # W and the states as Refs: pl.kernel aliases them in and out. run_state
    # keeps the Refs inside (a pure function of the initial values), which
    # custom_vmap needs.
    def on_refs(refs):
      pl.kernel(functools.partial(body, in_place=True), out_type=(),
                mesh=plgpu.Mesh(**mesh), compiler_params=params,
                name=name)(*args[:len(operands)], *refs)
    return list(_run_state(on_refs)(tuple(args[len(operands):])))

  @aliased.def_vmap
  def _batched(axis_size, in_batched, *args):
    # pl.kernel batches Ref operands only with a batch of 1: under vmap the
    # batch runs on fresh buffers (a copy of W and the states, not in place).
    # The same rule runs in interpret mode, so the CPU tests cover it.
    args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, b in zip(args, in_batched)]
    return jax.vmap(fresh)(*args), [True] * len(out_type)

  outs = (aliased if in_place else fresh)(*operands, *arrays)
  new_state = []
  for st, entry in zip(state, layout.states):
    if len(entry) == 3:
      new_state.append(quantization.with_scale_layout(quantization.QuantizedArray(
          outs[entry[0]], outs[entry[1]], st.nonnegative, scale_transposed=True),
          st.scale_transposed))
    else:
      new_state.append(outs[entry[0]].T.astype(st.dtype) if fold > 1
                       else outs[entry[0]])
  return outs[0], tuple(new_state)

"""Pallas (Triton backend) kernel: dW = xᵀ·dY per tile, optimizer in the epilogue.

Grid: one program per (block_m, block_n) output tile of W (in, out), laid out
on a 1-D grid in L2-friendly groups of ``group_m`` tile rows. Each program
loops over the token axis T in steps of ``block_t``, accumulating xᵀ·dY in
fp32, then loads the W and state tiles, applies ``rule.update`` in registers
and stores the new tiles into the buffers of the old ones
(``input_output_aliases``). The gradient tile never leaves registers.

Loads and stores are masked unless the axes divide by their blocks (decided
at trace time): any T, in and out are allowed, and no element outside the
arrays is read or written. Optimizer state may be fp32, bf16 or
int8 (codes plus one fp32 scale per 64 elements, quantized in the epilogue),
and may be narrower than W: a rule's ``state_cols`` maps the tile's columns
to its state's (folded moments keep bn / 2**l columns per tile).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import quantization
from pallas_kernels.fused_dw import reference
from pallas_kernels.fused_dw import tiling

with warnings.catch_warnings():
  # JAX >= 0.11 deprecates the Pallas Triton backend in favour of Mosaic GPU;
  # this package keeps Triton isolated here behind `implementation`.
  warnings.filterwarnings(
      "ignore", message=".*Triton.*deprecated.*", category=DeprecationWarning)
  from jax.experimental.pallas import triton as plgpu


@dataclasses.dataclass(frozen=True)
class FusedDWConfig:
  """Tile shape and launch parameters of the fused kernel.

  Attributes:
    block_m: rows of a W tile (the ``in`` axis); a power of two >= 16.
    block_n: columns of a W tile (the ``out`` axis); a power of two >= 16.
    block_t: tokens per step of the inner loop; a power of two >= 16.
    group_m: tile rows per L2 group of the 1-D grid ordering.
    num_warps: warps per program.
    num_stages: software-pipelining depth of the token loop.
    transpose_x: pass x to the kernel as xᵀ (in, T), transposed by XLA
      beforehand, so that the matmul's A operand is contiguous along the
      reduction axis (T); costs one copy of x.
    prefetch: how many of the epilogue's input tiles (W, then the states in
      order) are loaded before the token loop instead of after it, so that
      their memory latency hides behind the matmul; each costs registers.
  """

  block_m: int = 128
  block_n: int = 128
  block_t: int = 64
  group_m: int = 8
  num_warps: int = 8
  num_stages: int = 3
  transpose_x: bool = False
  prefetch: int = 0

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_t"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"FusedDWConfig.{name}={v} must be a power of two >= 16")
    for name in ("group_m", "num_warps", "num_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"FusedDWConfig.{name} must be >= 1")
    if self.prefetch < 0:
      raise ValueError(f"FusedDWConfig.prefetch={self.prefetch} must be >= 0")

  @classmethod
  def default(cls, t: int, d_in: int, d_out: int, dtype,
              min_tiles: int = 132, min_block_n: int = 16) -> "FusedDWConfig":
    """A heuristic configuration for x of shape (t, d_in), dY of (t, d_out).

    The token loop runs inside each program, so parallelism comes from the
    number of W tiles only: the largest tile that still gives ``min_tiles``
    programs (the H200's 132 multiprocessors) is taken, down to 32×32.
    ``block_n`` is at least ``min_block_n`` (64 for int8 state, whose
    quantization blocks must lie whole in a tile).
    """
    block_t = 64 if jnp.dtype(dtype).itemsize <= 2 else 32
    fit = lambda d, low: max(low, min(128, pl.next_power_of_2(d)))  # noqa: E731
    bm, bn = fit(d_in, 16), fit(d_out, min_block_n)
    # Keep the fp32 accumulator at most 128×128 (registers) when a rule needs
    # wide tiles (folded int8 moments: 64 state columns = 64·2**l of W's).
    bm = max(16, min(bm, (128 * 128) // bn))
    low_n = max(32, min_block_n)
    while (pl.cdiv(d_in, bm) * pl.cdiv(d_out, bn) < min_tiles
           and (bm > 32 or bn > low_n)):
      if (bm >= bn or bn <= low_n) and bm > 32:
        bm //= 2
      else:
        bn //= 2
    num_warps = 8 if bm * bn >= 128 * 128 else 4
    # A deeper pipeline pays off over long token loops (H200, T=8192,
    # 4096->14336, AdamW: 2.08 ms with 4 stages, 2.43 ms with 3).
    num_stages = 4 if t >= 4096 else 3
    return cls(block_m=bm, block_n=bn, block_t=block_t, num_warps=num_warps,
               num_stages=num_stages)


def _load(ref, mask):
  """A tile load, masked (zeros outside) unless ``mask`` is None."""
  if mask is None:
    return plgpu.load(ref)
  return plgpu.load(ref, mask=mask, other=jnp.zeros((), ref.dtype))


def _split(refs, kinds):
  """Groups state refs: one per plain state, (codes, scale) per int8 state."""
  out, i = [], 0
  for kind in kinds:
    if kind == "plain":
      out.append(refs[i])
      i += 1
    else:
      out.append((refs[i], refs[i + 1]))
      i += 2
  return out, refs[i:]


def _fused_dw_kernel(
    x_ref, dy_ref, hp_ref, *refs,
    rule, config: FusedDWConfig, precision, has_seed: bool, kinds,
    index_width: int,
):
  # refs: [seed (uint32 [seed, row0, col0])], w, *state, then the outputs
  # w, *state; an int8 state is two refs (codes, scale), kinds[i] says which
  # ("plain", "signed", "nonneg").
  seed_ref, refs = (refs[0], refs[1:]) if has_seed else (None, refs)
  w_ref, refs = refs[0], refs[1:]
  state_refs, refs = _split(refs, kinds)
  w_out_ref, refs = refs[0], refs[1:]
  state_out_refs, _ = _split(refs, kinds)
  t, d_in = x_ref.shape[::-1] if config.transpose_x else x_ref.shape
  d_out = dy_ref.shape[1]
  bm, bn, bt = config.block_m, config.block_n, config.block_t
  # Static: when every axis divides by its block, the token loop's loads
  # need no masks (cheaper address arithmetic, better pipelining).
  even_t = t % bt == 0
  even_mn = d_in % bm == 0 and d_out % bn == 0

  # L2-grouped ordering of the 1-D grid: group_m tile rows share x blocks.
  pid_m, pid_n = tiling.grouped_tile(pl.program_id(0), pl.cdiv(d_in, bm),
                                     pl.cdiv(d_out, bn), config.group_m)

  rows = pid_m * bm + jnp.arange(bm)
  cols = pid_n * bn + jnp.arange(bn)
  row_mask = rows < d_in
  col_mask = cols < d_out

  def body(k, acc):
    tok = k * bt + jnp.arange(bt)
    tok_mask = tok < t
    x_mask = dy_mask = None
    if not (even_t and even_mn):
      x_mask = (row_mask[:, None] & tok_mask[None, :] if config.transpose_x
                else tok_mask[:, None] & row_mask[None, :])
      dy_mask = tok_mask[:, None] & col_mask[None, :]
    if config.transpose_x:
      x = _load(x_ref.at[pl.ds(pid_m * bm, bm), pl.ds(k * bt, bt)], x_mask)
    else:
      x = _load(x_ref.at[pl.ds(k * bt, bt), pl.ds(pid_m * bm, bm)], x_mask)
    dy = _load(dy_ref.at[pl.ds(k * bt, bt), pl.ds(pid_n * bn, bn)], dy_mask)
    return acc + plgpu.dot(x, dy, trans_a=not config.transpose_x,
                           precision=precision)


  tile = (pl.ds(pid_m * bm, bm), pl.ds(pid_n * bn, bn))
  mask = row_mask[:, None] & col_mask[None, :]
  if even_mn:
    mask = None
  # The state tile: bs columns of the state arrays (bn for an elementwise
  # rule, bn / 2**l for folded moments).
  bs = rule.state_cols(bn)
  d_state = rule.state_shape((d_in, d_out))[1]
  scol_mask = pid_n * bs + jnp.arange(bs) < d_state
  stile = (pl.ds(pid_m * bm, bm), pl.ds(pid_n * bs, bs))
  smask = row_mask[:, None] & scol_mask[None, :]
  if even_mn and d_state % bs == 0:
    smask = None
  # Scales of the int8 states: bs / 64 blocks per tile row.
  nb = max(bs // quantization.BLOCK_SIZE, 1)
  blocks = pid_n * nb + jnp.arange(nb)
  scale_tile = (pl.ds(pid_m * bm, bm), pl.ds(pid_n * nb, nb))
  scale_mask = row_mask[:, None] & (
      blocks < quantization.num_blocks(d_state))[None, :]
  if smask is None and quantization.num_blocks(d_state) % nb == 0:
    scale_mask = None
  block_view = (bm, nb, quantization.BLOCK_SIZE)

  def fetch_state(r, kind):
    """The state tile as stored (a tile, or int8 codes and their scales)."""
    if kind == "plain":
      return _load(r.at[stile], smask)
    codes_ref, scale_ref = r
    return (_load(codes_ref.at[stile], smask),
            _load(scale_ref.at[scale_tile], scale_mask))

  def decode_state(kind, stored):
    if kind == "plain":
      return stored.astype(jnp.float32)
    codes, scale = stored
    values = quantization.dequantize_blocks(
        codes.reshape(block_view), scale, kind == "nonneg")
    return values.reshape(bm, bs)

  def store_state(r, kind, v):
    if kind == "plain":
      plgpu.store(r.at[stile], v.astype(r.dtype), mask=smask)
      return
    codes_ref, scale_ref = r
    # Lanes outside the state are zeroed so they do not enter a block's absmax.
    if smask is not None:
      v = jnp.where(smask, v, 0.0)
    v = v.reshape(block_view)
    codes, scale = quantization.quantize_blocks(v, kind == "nonneg")
    plgpu.store(codes_ref.at[stile], codes.reshape(bm, bs).astype(jnp.int8),
                mask=smask)
    plgpu.store(scale_ref.at[scale_tile], scale, mask=scale_mask)

  # The epilogue's input tiles as stored (W, then each state), the first
  # ``config.prefetch`` of them loaded before the token loop so that their
  # memory latency overlaps the matmul (at the cost of registers); decoded
  # to fp32 only after it.
  loaders = [lambda: _load(w_ref.at[tile], mask)] + [
      functools.partial(fetch_state, r, k) for r, k in zip(state_refs, kinds)]
  early = [f() for f in loaders[:config.prefetch]]
  grad = lax.fori_loop(
      0, pl.cdiv(t, bt), body, jnp.zeros((bm, bn), jnp.float32))
  stored = early + [f() for f in loaders[config.prefetch:]]
  w = stored[0]
  state = tuple(decode_state(k, v) for k, v in zip(kinds, stored[1:]))
  hp, count = rule.unpack(hp_ref)
  new_w, new_state = rule.update_masked(
      grad, w.astype(jnp.float32), state, hp, count, col_mask)
  index = None
  if has_seed:
    # Global element index (this W may be one shard of a wider weight).
    index = reference.element_index(rows, cols, seed_ref[1], seed_ref[2],
                                    index_width)
  new_w = reference.round_weight(
      new_w, w_out_ref.dtype, seed_ref[0] if has_seed else None, count, index)
  plgpu.store(w_out_ref.at[tile], new_w, mask=mask)
  for r, k, v in zip(state_out_refs, kinds, new_state):
    store_state(r, k, v)


def fused_dw_update_triton(
    x, dy, w, state, hparams, *, rule, config: FusedDWConfig, interpret: bool,
    seed=None, index_offset=(0, 0), index_width=None,
):
  """Runs the kernel; arguments as :func:`pallas_kernels.fused_dw.fused_dw_update`."""
  seeds = () if seed is None else (jnp.stack(
      [reference.as_uint32(v) for v in (seed, *index_offset)]),)
  d_in, d_out = w.shape
  kinds = tuple("plain" if not isinstance(s, quantization.QuantizedArray)
                else "nonneg" if s.nonnegative else "signed" for s in state)
  flat_state = []
  for s in state:
    flat_state += ([s.codes, s.scale] if isinstance(s, quantization.QuantizedArray)
                   else [s])
  # fp32 operands: full fp32 products (no TF32), so fp32 results match the
  # reference to rounding; bf16 operands use the tensor cores as they are.
  precision = (lax.Precision.HIGHEST if x.dtype == jnp.float32
               else lax.Precision.DEFAULT)
  kernel = functools.partial(
      _fused_dw_kernel, rule=rule, config=config, precision=precision,
      has_seed=bool(seeds), kinds=kinds,
      index_width=d_out if index_width is None else index_width)
  num_tiles = pl.cdiv(d_in, config.block_m) * pl.cdiv(d_out, config.block_n)
  n_flat = len(flat_state)
  out_shape = [jax.ShapeDtypeStruct(w.shape, w.dtype)] + [
      jax.ShapeDtypeStruct(s.shape, s.dtype) for s in flat_state]
  outs = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(num_tiles,),
      input_output_aliases={3 + len(seeds) + i: i for i in range(1 + n_flat)},
      compiler_params=plgpu.CompilerParams(
          num_warps=config.num_warps, num_stages=config.num_stages),
      interpret=interpret,
      name=f"forge_fused_dw_{rule.name}",
  )(x.T if config.transpose_x else x, dy, hparams, *seeds, w, *flat_state)
  new_state, i = [], 1
  for s in state:
    if isinstance(s, quantization.QuantizedArray):
      new_state.append(quantization.QuantizedArray(
          outs[i], outs[i + 1], s.nonnegative))
      i += 2
    else:
      new_state.append(outs[i])
      i += 1
  return outs[0], tuple(new_state)

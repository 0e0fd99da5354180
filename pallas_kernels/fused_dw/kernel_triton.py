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
import numbers
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
import numpy as np

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
      their memory latency hides behind the matmul; each costs registers
      (with ``epilogue_split`` > 1, the first column chunk's tiles only).
    epilogue_split: the tile's columns are accumulated in this many separate
      (block_m, block_n / epilogue_split) chunks (one dot each per token
      step) and the epilogue loads, updates and stores one chunk after the
      other, so that it holds the W and state values of one chunk at a time
      in registers instead of the whole tile's; a power of two.
  """

  block_m: int = 128
  block_n: int = 128
  block_t: int = 64
  group_m: int = 8
  num_warps: int = 8
  num_stages: int = 3
  transpose_x: bool = False
  prefetch: int = 0
  epilogue_split: int = 1

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      is_bool = isinstance(v, (bool, np.bool_))
      if f.name == "transpose_x" and not is_bool:
        raise ValueError(f"FusedDWConfig.transpose_x={v!r} must be a bool")
      if f.name != "transpose_x" and (
          is_bool or not isinstance(v, numbers.Integral)):
        raise ValueError(f"FusedDWConfig.{f.name}={v!r} must be an int")
    for name in ("block_m", "block_n", "block_t"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"FusedDWConfig.{name}={v} must be a power of two >= 16")
    for name in ("group_m", "num_warps", "num_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"FusedDWConfig.{name} must be >= 1")
    if self.prefetch < 0:
      raise ValueError(f"FusedDWConfig.prefetch={self.prefetch} must be >= 0")
    e = self.epilogue_split
    if e < 1 or e & (e - 1) or self.block_n // e < 16:
      raise ValueError(
          f"FusedDWConfig.epilogue_split={e} must be a power of two with "
          f"block_n / epilogue_split >= 16 (block_n={self.block_n})")

  @property
  def chunk_n(self) -> int:
    """Columns of one epilogue chunk (``block_n / epilogue_split``)."""
    return self.block_n // self.epilogue_split

  @classmethod
  def default(cls, t: int, d_in: int, d_out: int, dtype,
              min_tiles: int = 132, min_block_n: int = 16,
              quantized: bool = False) -> "FusedDWConfig":
    """A heuristic configuration for x of shape (t, d_in), dY of (t, d_out).

    The token loop runs inside each program, so parallelism comes from the
    number of W tiles only: the largest tile that still gives ``min_tiles``
    programs (the H200's 132 multiprocessors) is taken, down to 32×32.
    ``block_n`` is at least ``min_block_n`` (64 for int8 state, whose
    quantization blocks must lie whole in a tile). ``quantized`` (int8
    state) keeps the 3-stage, one-chunk epilogue below T=4096, which
    measured faster for it (H200, AdamW int8, 4096->14336: 0.69 against
    1.08 ms at T=512, 1.02 against 1.44 at 2048; at T=8192, where all
    states get 4 stages, one chunk took 2.11 ms and two 3.00). Unquantized
    states get 4 stages where 4 of them fit in 128 KiB of shared memory
    (else 3 below T=4096), and two chunks for 128×128 tiles or larger.
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
    # A deeper pipeline pays off (H200, 4096->14336, AdamW fp32: 2.08 ms
    # with 4 stages, 2.43 ms with 3 at T=8192; 0.85 against 0.97 ms at
    # T=512) where its shared memory is small enough.
    stage_bytes = block_t * (bm + bn) * jnp.dtype(dtype).itemsize
    num_stages = 4 if t >= 4096 or (
        4 * stage_bytes <= 128 * 1024 and not quantized) else 3
    # A 128x128 fp32 accumulator plus the whole tile's W and moments does
    # not fit in 255 registers per thread: ptxas spilled 1.1 GB of local
    # memory at T=512 (ncu). Two column chunks spill nothing (H200, AdamW
    # fp32, 4096->14336: 0.76 against 0.85 ms at T=512, 1.05 against 1.09
    # at 2048, equal at 8192).
    split = 2 if (bm * bn >= 128 * 128 and bn // 2 >= min_block_n
                  and not quantized) else 1
    return cls(block_m=bm, block_n=bn, block_t=block_t, num_warps=num_warps,
               num_stages=num_stages, epilogue_split=split)


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
  row_mask = rows < d_in
  # The tile's columns in ``split`` chunks of cn, each with its own
  # accumulator (one dot per chunk and token step) and epilogue.
  split = config.epilogue_split
  cn = bn // split

  def chunk_cols(c):
    return pid_n * bn + c * cn + jnp.arange(cn)

  def body(k, accs):
    tok = k * bt + jnp.arange(bt)
    tok_mask = tok < t
    x_mask = None
    if not (even_t and even_mn):
      x_mask = (row_mask[:, None] & tok_mask[None, :] if config.transpose_x
                else tok_mask[:, None] & row_mask[None, :])
    if config.transpose_x:
      x = _load(x_ref.at[pl.ds(pid_m * bm, bm), pl.ds(k * bt, bt)], x_mask)
    else:
      x = _load(x_ref.at[pl.ds(k * bt, bt), pl.ds(pid_m * bm, bm)], x_mask)
    out = []
    for c, acc in enumerate(accs):
      dy_mask = None
      if not (even_t and even_mn):
        dy_mask = tok_mask[:, None] & (chunk_cols(c) < d_out)[None, :]
      dy = _load(dy_ref.at[pl.ds(k * bt, bt), pl.ds(pid_n * bn + c * cn, cn)],
                 dy_mask)
      out.append(acc + plgpu.dot(x, dy, trans_a=not config.transpose_x,
                                 precision=precision))
    return tuple(out)

  # The state chunk: bs columns of the state arrays (cn for an elementwise
  # rule, cn / 2**l for folded moments).
  bs = rule.state_cols(cn)
  d_state = rule.state_shape((d_in, d_out))[1]
  # Scales of the int8 states: bs / 64 blocks per chunk row.
  nb = max(bs // quantization.BLOCK_SIZE, 1)
  block_view = (bm, nb, quantization.BLOCK_SIZE)

  def windows(c):
    """Index windows and masks (None when not needed) of chunk c."""
    cols = chunk_cols(c)
    col_mask = cols < d_out
    mask = None if even_mn else row_mask[:, None] & col_mask[None, :]
    s0 = (pid_n * split + c) * bs
    smask = row_mask[:, None] & (s0 + jnp.arange(bs) < d_state)[None, :]
    if even_mn and d_state % bs == 0:
      smask = None
    b0 = (pid_n * split + c) * nb
    scale_mask = row_mask[:, None] & (
        b0 + jnp.arange(nb) < quantization.num_blocks(d_state))[None, :]
    if smask is None and quantization.num_blocks(d_state) % nb == 0:
      scale_mask = None
    return dict(
        cols=cols, col_mask=col_mask, mask=mask, smask=smask,
        scale_mask=scale_mask,
        tile=(pl.ds(pid_m * bm, bm), pl.ds(pid_n * bn + c * cn, cn)),
        stile=(pl.ds(pid_m * bm, bm), pl.ds(s0, bs)),
        scale_tile=(pl.ds(pid_m * bm, bm), pl.ds(b0, nb)))

  def fetch_state(r, kind, win):
    """The state tile as stored (a tile, or int8 codes and their scales)."""
    if kind == "plain":
      return _load(r.at[win["stile"]], win["smask"])
    codes_ref, scale_ref = r
    return (_load(codes_ref.at[win["stile"]], win["smask"]),
            _load(scale_ref.at[win["scale_tile"]], win["scale_mask"]))

  def decode_state(kind, stored):
    if kind == "plain":
      return stored.astype(jnp.float32)
    codes, scale = stored
    values = quantization.dequantize_blocks(
        codes.reshape(block_view), scale, kind == "nonneg")
    return values.reshape(bm, bs)

  def store_state(r, kind, v, win):
    smask = win["smask"]
    if kind == "plain":
      plgpu.store(r.at[win["stile"]], v.astype(r.dtype), mask=smask)
      return
    codes_ref, scale_ref = r
    # Lanes outside the state are zeroed so they do not enter a block's absmax.
    if smask is not None:
      v = jnp.where(smask, v, 0.0)
    v = v.reshape(block_view)
    codes, scale = quantization.quantize_blocks(v, kind == "nonneg")
    plgpu.store(codes_ref.at[win["stile"]],
                codes.reshape(bm, bs).astype(jnp.int8), mask=smask)
    plgpu.store(scale_ref.at[win["scale_tile"]], scale, mask=win["scale_mask"])

  def loaders(win):
    return [lambda: _load(w_ref.at[win["tile"]], win["mask"])] + [
        functools.partial(fetch_state, r, k, win)
        for r, k in zip(state_refs, kinds)]

  def epilogue(grad, win, early):
    stored = early + [f() for f in loaders(win)[len(early):]]
    hp, count = rule.unpack(hp_ref)
    w = stored[0]
    state = tuple(decode_state(k, v) for k, v in zip(kinds, stored[1:]))
    new_w, new_state = rule.update_masked(
        grad, w.astype(jnp.float32), state, hp, count, win["col_mask"])
    index = None
    if has_seed:
      # Global element index (this W may be one shard of a wider weight).
      index = reference.element_index(rows, win["cols"], seed_ref[1],
                                      seed_ref[2], index_width)
    new_w = reference.round_weight(
        new_w, w_out_ref.dtype, seed_ref[0] if has_seed else None, count, index)
    plgpu.store(w_out_ref.at[win["tile"]], new_w, mask=win["mask"])
    for r, k, v in zip(state_out_refs, kinds, new_state):
      store_state(r, k, v, win)

  # The epilogue's input tiles as stored (W, then each state), the first
  # ``config.prefetch`` of the first chunk's loaded before the token loop so
  # that their memory latency overlaps the matmul (at the cost of
  # registers); decoded to fp32 only after it.
  wins = [windows(c) for c in range(split)]
  early = [f() for f in loaders(wins[0])[:config.prefetch]]
  accs = lax.fori_loop(
      0, pl.cdiv(t, bt), body,
      tuple(jnp.zeros((bm, cn), jnp.float32) for _ in range(split)))
  for c in range(split):
    epilogue(accs[c], wins[c], early if c == 0 else [])


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
    # int8 scales in their natural layout, (in, out / 64), as the tiles read them
    flat_state += ([s.codes, quantization.natural_scale(s)]
                   if isinstance(s, quantization.QuantizedArray) else [s])
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
      new_state.append(quantization.with_scale_layout(
          quantization.QuantizedArray(outs[i], outs[i + 1], s.nonnegative),
          s.scale_transposed))
      i += 2
    else:
      new_state.append(outs[i])
      i += 1
  return outs[0], tuple(new_state)

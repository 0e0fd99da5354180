"""Pallas (Triton backend) kernel: dW = xᵀ·dY per tile, optimizer in the epilogue.

Grid: one program per (block_m, block_n) output tile of W (in, out), laid out
on a 1-D grid in L2-friendly groups of ``group_m`` tile rows. Each program
loops over the token axis T in steps of ``block_t``, accumulating xᵀ·dY in
fp32, then loads the W and state tiles, applies ``rule.update`` in registers
and stores the new tiles into the buffers of the old ones
(``input_output_aliases``). The gradient tile never leaves registers.

Every load and store is masked: any T, in and out are allowed, and no element
outside the arrays is read or written.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.fused_dw import reference

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
  """

  block_m: int = 128
  block_n: int = 128
  block_t: int = 64
  group_m: int = 8
  num_warps: int = 8
  num_stages: int = 3

  def __post_init__(self):
    for name in ("block_m", "block_n", "block_t"):
      v = getattr(self, name)
      if v < 16 or v & (v - 1):
        raise ValueError(f"FusedDWConfig.{name}={v} must be a power of two >= 16")
    for name in ("group_m", "num_warps", "num_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"FusedDWConfig.{name} must be >= 1")

  @classmethod
  def default(cls, t: int, d_in: int, d_out: int, dtype,
              min_tiles: int = 132) -> "FusedDWConfig":
    """A heuristic configuration for x of shape (t, d_in), dY of (t, d_out).

    The token loop runs inside each program, so parallelism comes from the
    number of W tiles only: the largest tile that still gives ``min_tiles``
    programs (the H200's 132 multiprocessors) is taken, down to 32×32.
    """
    del t
    block_t = 64 if jnp.dtype(dtype).itemsize <= 2 else 32
    fit = lambda d: max(16, min(128, pl.next_power_of_2(d)))  # noqa: E731
    bm, bn = fit(d_in), fit(d_out)
    while pl.cdiv(d_in, bm) * pl.cdiv(d_out, bn) < min_tiles and max(bm, bn) > 32:
      if bm >= bn:
        bm //= 2
      else:
        bn //= 2
    num_warps = 8 if bm * bn >= 128 * 128 else 4
    return cls(block_m=bm, block_n=bn, block_t=block_t, num_warps=num_warps)


def _fused_dw_kernel(
    x_ref, dy_ref, hp_ref, *refs,
    rule, config: FusedDWConfig, precision, has_seed: bool,
):
  # refs: [seed], w, *state, then the outputs w, *state.
  n_state = len(rule.state_names)
  seed_ref, refs = (refs[0], refs[1:]) if has_seed else (None, refs)
  w_ref, state_refs = refs[0], refs[1:1 + n_state]
  w_out_ref, *state_out_refs = refs[1 + n_state:]
  t, d_in = x_ref.shape
  d_out = dy_ref.shape[1]
  bm, bn, bt = config.block_m, config.block_n, config.block_t

  # L2-grouped ordering of the 1-D grid: group_m tile rows share x blocks.
  pid = pl.program_id(0)
  num_m = pl.cdiv(d_in, bm)
  num_n = pl.cdiv(d_out, bn)
  in_group = config.group_m * num_n
  group = pid // in_group
  first_m = group * config.group_m
  group_size = jnp.minimum(num_m - first_m, config.group_m)
  pid_m = first_m + (pid % in_group) % group_size
  pid_n = (pid % in_group) // group_size

  rows = pid_m * bm + jnp.arange(bm)
  cols = pid_n * bn + jnp.arange(bn)
  row_mask = rows < d_in
  col_mask = cols < d_out

  def body(k, acc):
    tok = k * bt + jnp.arange(bt)
    tok_mask = tok < t
    x = plgpu.load(x_ref.at[pl.ds(k * bt, bt), pl.ds(pid_m * bm, bm)],
                   mask=tok_mask[:, None] & row_mask[None, :], other=0.0)
    dy = plgpu.load(dy_ref.at[pl.ds(k * bt, bt), pl.ds(pid_n * bn, bn)],
                    mask=tok_mask[:, None] & col_mask[None, :], other=0.0)
    return acc + plgpu.dot(x, dy, trans_a=True, precision=precision)

  grad = lax.fori_loop(
      0, pl.cdiv(t, bt), body, jnp.zeros((bm, bn), jnp.float32))

  tile = (pl.ds(pid_m * bm, bm), pl.ds(pid_n * bn, bn))
  mask = row_mask[:, None] & col_mask[None, :]
  hp, count = rule.unpack(hp_ref)
  w = plgpu.load(w_ref.at[tile], mask=mask, other=0.0)
  state = tuple(plgpu.load(r.at[tile], mask=mask, other=0.0) for r in state_refs)
  new_w, new_state = rule.update(
      grad, w.astype(jnp.float32), tuple(s.astype(jnp.float32) for s in state),
      hp, count)
  index = (rows[:, None] * d_out + cols[None, :]).astype(jnp.uint32)
  new_w = reference.round_weight(
      new_w, w_out_ref.dtype, seed_ref[0] if has_seed else None, count, index)
  plgpu.store(w_out_ref.at[tile], new_w, mask=mask)
  for r, v in zip(state_out_refs, new_state):
    plgpu.store(r.at[tile], v.astype(r.dtype), mask=mask)


def fused_dw_update_triton(
    x, dy, w, state, hparams, *, rule, config: FusedDWConfig, interpret: bool,
    seed=None,
):
  """Runs the kernel; arguments as :func:`pallas_kernels.fused_dw.fused_dw_update`."""
  seeds = () if seed is None else (jnp.reshape(seed, (1,)).astype(jnp.uint32),)
  d_in, d_out = w.shape
  # fp32 operands: full fp32 products (no TF32), so fp32 results match the
  # reference to rounding; bf16 operands use the tensor cores as they are.
  precision = (lax.Precision.HIGHEST if x.dtype == jnp.float32
               else lax.Precision.DEFAULT)
  kernel = functools.partial(
      _fused_dw_kernel, rule=rule, config=config, precision=precision,
      has_seed=bool(seeds))
  num_tiles = pl.cdiv(d_in, config.block_m) * pl.cdiv(d_out, config.block_n)
  n_state = len(state)
  out_shape = [jax.ShapeDtypeStruct(w.shape, w.dtype)] + [
      jax.ShapeDtypeStruct(s.shape, s.dtype) for s in state]
  outs = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(num_tiles,),
      input_output_aliases={3 + len(seeds) + i: i for i in range(1 + n_state)},
      compiler_params=plgpu.CompilerParams(
          num_warps=config.num_warps, num_stages=config.num_stages),
      interpret=interpret,
      name=f"forge_fused_dw_{rule.name}",
  )(x, dy, hparams, *seeds, w, *state)
  return outs[0], tuple(outs[1:])

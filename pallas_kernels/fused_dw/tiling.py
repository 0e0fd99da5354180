"""Tile ordering shared by the fused kernels (Triton and Mosaic GPU)."""

import jax.numpy as jnp


def grouped_tile(lin, num_m: int, num_n: int, group_m: int):
  """(row, column) of the ``lin``-th tile of a (num_m, num_n) tile grid in
  L2-friendly order: groups of ``group_m`` tile rows, column-major inside a
  group, so that consecutive tiles share their x blocks (``lin`` may be a
  traced int32 scalar)."""
  in_group = group_m * num_n
  first_m = (lin // in_group) * group_m
  group_size = jnp.minimum(num_m - first_m, group_m)
  return first_m + (lin % in_group) % group_size, (lin % in_group) // group_size

"""scan_residuals: what a scanned step keeps for its backward, traced."""

import pytest

from experiments import scan_residuals
from forge_jax.models import llama


def test_remat_keeps_block_inputs_and_fused_scan_keeps_less_than_optax(capsys):
  rows = {(r["optimizer"], r["layout"]): r for r in scan_residuals.main(
      ["--model", "cpu-tiny", "--tokens", "16", "--optimizers", "optax,forge-bf16"])}
  cfg = llama.get_config("cpu-tiny")
  block_input = 16 * cfg.d_model * 2  # (1, T, d) in bf16
  for opt in ("optax", "forge-bf16"):
    remat = rows[(opt, "scan+remat")]
    assert (remat["arrays"], remat["per_block_bytes"]) == (1, block_input), remat
    assert remat["total_bytes"] == block_input * cfg.n_layers
  # Without remat: the fused scan keeps the matmul outputs (the elementwise
  # rest is recomputed), optax's nn.scan every residual of jax.vjp.
  fused, optax = rows[("forge-bf16", "scan")], rows[("optax", "scan")]
  assert block_input < fused["per_block_bytes"] < optax["per_block_bytes"], rows
  assert fused["arrays"] < optax["arrays"]
  assert "| cpu-tiny | 16 | forge-bf16 | scan |" in capsys.readouterr().out


def test_refuses_a_layout_that_does_not_scan():
  with pytest.raises(ValueError, match="does not scan"):
    scan_residuals.measure("cpu-tiny", 16, "forge-bf16", "unrolled")

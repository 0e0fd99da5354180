"""The model-scale memory experiment runs end to end on a tiny model (CPU)."""

import jax
import pytest

from experiments import memory_llama


def test_variants_run_and_report_memory_and_state():
  optax_row = memory_llama.run_one("cpu-tiny", 16, "optax", "unrolled", steps=2)
  int8_row = memory_llama.run_one("cpu-tiny", 16, "forge-fold-int8", "scan+remat",
                                  steps=2)
  for row in (optax_row, int8_row):
    assert row["temp_size_in_bytes"] > 0 and row["argument_size_in_bytes"] > 0
    assert row["step_s"] > 0 and row["loss"] == row["loss"]  # finite, not NaN
  # bf16 Adam moments: 2 bytes x 2 per param; int8 folded (l=3) moments for the
  # projections and int8 for the rest: well under a quarter of that.
  assert int8_row["optimizer_state_bytes"] < 0.3 * optax_row["optimizer_state_bytes"]


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices of the "
                    "default backend (CI: two host CPUs)")
def test_tensor_parallel_variant_runs_sharded():
  row = memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "scan+remat", steps=2,
                             tp=2)
  assert row["tp"] == 2 and row["loss"] == row["loss"]
  # Each device holds half of the projections and their moments: the
  # arguments of the sharded step (per device) are well under the whole's.
  whole = row["param_bytes"] + row["optimizer_state_bytes"]
  assert row["argument_size_in_bytes"] < 0.8 * whole

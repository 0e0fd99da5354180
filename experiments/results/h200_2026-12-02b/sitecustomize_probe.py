"""Probe patches, applied at interpreter start when devrun/patch is on PYTHONPATH:
FORGE_FORCE_ORDER=1: order the fused updates even with stacked (scanned) layers;
FORGE_ORDER_FORM=side: the barrier orders (dx, new_kernel) but the new kernel bypasses it."""
import os
if os.environ.get("FORGE_FORCE_ORDER") == "1" or os.environ.get("FORGE_ORDER_FORM"):
  from jax import lax
  from forge_jax._src import train_state as _ts, dense as _dense
  if os.environ.get("FORGE_FORCE_ORDER") == "1":
    _ts._order_updates = lambda state, order_updates: True
  if os.environ.get("FORGE_ORDER_FORM") == "side":
    def _side(dx, new_kernel):
      return lax.optimization_barrier((dx, new_kernel))[0], new_kernel
    _dense.order_update = _side

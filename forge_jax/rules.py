"""Elementwise optimizer rules: one definition per optimizer, fused or not."""

from forge_jax._src.rules import ADAMW
from forge_jax._src.rules import ElementwiseRule

__all__ = ["ADAMW", "ElementwiseRule"]

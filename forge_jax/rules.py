"""Elementwise optimizer rules: one definition per optimizer, fused or not."""

from forge_jax._src.rules import ADAGRAD
from forge_jax._src.rules import ADAMW
from forge_jax._src.rules import ALL_RULES
from forge_jax._src.rules import ElementwiseRule
from forge_jax._src.rules import LION
from forge_jax._src.rules import NADAMW
from forge_jax._src.rules import RADAM
from forge_jax._src.rules import RMSPROP
from forge_jax._src.rules import SGD
from forge_jax._src.rules import SGD_MOMENTUM
from forge_jax._src.rules import SGD_NESTEROV

__all__ = ["ADAGRAD", "ADAMW", "ALL_RULES", "ElementwiseRule", "LION", "NADAMW",
           "RADAM", "RMSPROP", "SGD", "SGD_MOMENTUM", "SGD_NESTEROV"]

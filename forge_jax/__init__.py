"""forge_jax: fused optimizer updates (FORGE) and folded moments (FOAM) in JAX.

Replace ``flax.linen.Dense`` with :class:`ForgeDense` and train with
:func:`make_train_step`: each fused layer's optimizer update runs inside its
own backward pass, and the weight gradient never exists in device memory.
"""

from forge_jax import rules
from forge_jax._src.checkpoint import latest_checkpoint_step
from forge_jax._src.checkpoint import restore_checkpoint
from forge_jax._src.checkpoint import save_checkpoint
from forge_jax._src.dense import ForgeDense
from forge_jax._src.train_state import FusedTrainStep
from forge_jax._src.train_state import TrainState
from forge_jax._src.train_state import fused_kernel_paths
from forge_jax._src.train_state import fused_step
from forge_jax._src.train_state import make_train_step
from forge_jax._src.transforms import ForgeTransformation
from forge_jax._src.transforms import ScaleByAdamWState
from forge_jax._src.transforms import adamw
from forge_jax._src.transforms import scale_by_adamw

__version__ = "0.1.0"

__all__ = [
    "ForgeDense",
    "ForgeTransformation",
    "FusedTrainStep",
    "ScaleByAdamWState",
    "TrainState",
    "adamw",
    "fused_kernel_paths",
    "fused_step",
    "latest_checkpoint_step",
    "make_train_step",
    "restore_checkpoint",
    "rules",
    "save_checkpoint",
    "scale_by_adamw",
]

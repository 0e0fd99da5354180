"""forge_jax: fused optimizer updates (FORGE) and folded moments (FOAM) in JAX.

Replace ``flax.linen.Dense`` with :class:`ForgeDense` and train with
:func:`make_train_step`: each fused layer's optimizer update runs inside its
own backward pass, and the weight gradient never exists in device memory.
"""

from forge_jax import rules
from forge_jax._src.checkpoint import checkpoint_metadata
from forge_jax._src.checkpoint import latest_checkpoint_step
from forge_jax._src.checkpoint import restore_checkpoint
from forge_jax._src.checkpoint import save_checkpoint
from forge_jax._src.dense import ForgeDense
from forge_jax._src.embed import ForgeEmbed
from forge_jax._src.fold import FoldAdamState
from forge_jax._src.fold import fold_adam
from forge_jax._src.fold import fold_adam_labels
from forge_jax._src.fold import hybrid_fold_adam
from forge_jax._src.fold import scale_by_fold_adam
from forge_jax._src.inplace_scan import inplace_scan
from forge_jax._src.inplace_scan import recompute_elementwise
from forge_jax._src.train_state import FusedTrainStep
from forge_jax._src.train_state import SCAN_GPU_COMPILER_OPTIONS
from forge_jax._src.train_state import TrainState
from forge_jax._src.train_state import fused_kernel_paths
from forge_jax._src.train_state import fused_step
from forge_jax._src.train_state import make_train_step
from forge_jax._src.transforms import ForgeTransformation
from forge_jax._src.transforms import ScaleByAdamWState
from forge_jax._src.transforms import ScaleByLionState
from forge_jax._src.transforms import ScaleByMomentumState
from forge_jax._src.transforms import ScaleByRmsState
from forge_jax._src.transforms import ScaleByRssState
from forge_jax._src.transforms import ScaleBySgdState
from forge_jax._src.transforms import adagrad
from forge_jax._src.transforms import adamw
from forge_jax._src.transforms import lion
from forge_jax._src.transforms import nadamw
from forge_jax._src.transforms import radam
from forge_jax._src.transforms import rmsprop
from forge_jax._src.transforms import scale_by_adamw
from forge_jax._src.transforms import scale_by_lion
from forge_jax._src.transforms import scale_by_momentum
from forge_jax._src.transforms import scale_by_nadamw
from forge_jax._src.transforms import scale_by_radam
from forge_jax._src.transforms import scale_by_rms
from forge_jax._src.transforms import scale_by_rss
from forge_jax._src.transforms import scale_by_sgd
from forge_jax._src.transforms import sgd

__version__ = "0.1.0"

__all__ = [
    "FoldAdamState",
    "ForgeDense",
    "ForgeEmbed",
    "ForgeTransformation",
    "FusedTrainStep",
    "SCAN_GPU_COMPILER_OPTIONS",
    "ScaleByAdamWState",
    "ScaleByLionState",
    "ScaleByMomentumState",
    "ScaleByRmsState",
    "ScaleByRssState",
    "ScaleBySgdState",
    "TrainState",
    "adagrad",
    "adamw",
    "fold_adam",
    "fold_adam_labels",
    "fused_kernel_paths",
    "fused_step",
    "hybrid_fold_adam",
    "inplace_scan",
    "recompute_elementwise",
    "checkpoint_metadata",
    "latest_checkpoint_step",
    "lion",
    "make_train_step",
    "nadamw",
    "radam",
    "restore_checkpoint",
    "rmsprop",
    "rules",
    "save_checkpoint",
    "scale_by_adamw",
    "scale_by_fold_adam",
    "scale_by_lion",
    "scale_by_momentum",
    "scale_by_nadamw",
    "scale_by_radam",
    "scale_by_rms",
    "scale_by_rss",
    "scale_by_sgd",
    "sgd",
]

# Names a user may reach for (optax's adam and nadam; SGD with momentum) that
# have no fused transformation of their own: what to call instead. Attribute
# access only: `from forge_jax import adam` gets Python's plain ImportError.
_INSTEAD = {
    "adam": "adamw(learning_rate, weight_decay=0.0)",
    "nadam": "nadamw(learning_rate, weight_decay=0.0)",
    "momentum": "sgd(learning_rate, momentum=0.9)",
    "sgd_momentum": "sgd(learning_rate, momentum=0.9)",
}
_OPTIMIZERS = ("adamw", "nadamw", "radam", "lion", "rmsprop", "adagrad", "sgd",
               "fold_adam")


def __getattr__(name):
  if name in _INSTEAD:
    raise AttributeError(
        f"module 'forge_jax' has no attribute {name!r}: use forge_jax."
        f"{_INSTEAD[name]} (the fused optimizers: {', '.join(_OPTIMIZERS)})")
  raise AttributeError(f"module 'forge_jax' has no attribute {name!r}")

"""Fused weight gradient + elementwise optimizer update (FORGE)."""

from pallas_kernels.fused_dw.api import IMPLEMENTATIONS
from pallas_kernels.fused_dw.api import fused_dw_update
from pallas_kernels.fused_dw.api import is_batched
from pallas_kernels.fused_dw.api import resolve_implementation
from pallas_kernels.fused_dw.api import select_kernel
from pallas_kernels.fused_dw.kernel_mosaic import MosaicConfig
from pallas_kernels.fused_dw.kernel_triton import FusedDWConfig
from pallas_kernels.fused_dw.reference import fused_dw_update_reference
from pallas_kernels.fused_dw.reference import weight_grad_reference

__all__ = [
    "IMPLEMENTATIONS",
    "FusedDWConfig",
    "MosaicConfig",
    "fused_dw_update",
    "fused_dw_update_reference",
    "is_batched",
    "resolve_implementation",
    "select_kernel",
    "weight_grad_reference",
]

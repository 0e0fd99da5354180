"""Pallas GPU kernels of forge_jax, one folder per fused op.

Each op has a pure-jnp ``*_reference`` (test oracle and CPU fallback) and a
Pallas kernel selected by ``implementation``: ``'xla'`` (the reference),
``'triton'`` (Pallas Triton backend; never falls back silently) or ``None``
(the kernel on a GPU, the reference elsewhere).
"""

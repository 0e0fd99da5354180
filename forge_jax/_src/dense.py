"""ForgeDense: flax.linen.Dense whose backward pass also updates its kernel.

Outside a fused training step (plain ``model.apply``, ``jax.grad`` of it)
ForgeDense computes exactly what ``flax.linen.Dense`` computes and has the
same parameters, so the same model trains unfused with any optax optimizer.
Inside :func:`forge_jax.fused_step` (or :func:`forge_jax.make_train_step`) its
matmul runs through a ``custom_vjp`` whose backward computes dx with the old
kernel, then the fused weight-gradient + optimizer kernel, and returns the
*new* kernel and optimizer state as the cotangents of the old ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import threading
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype
from jax import lax

from forge_jax._src import transforms as transforms_lib
from pallas_kernels import fused_dw
from pallas_kernels import quantization

FORGE_STATE = "forge_state"
PROBE = "probe"
# In a fused step the step hands each fused layer its kernel a second time,
# as forge_state/<layer>/KERNEL_INPUT: the custom_vjp consumes that copy, so
# any other use of params/<layer>/kernel shows up as a dependency of the loss
# on the params copy, which the step refuses (tied or directly read kernels).
KERNEL_INPUT = "kernel"
ROUNDING_SEED = "rounding_seed"

default_kernel_init = nn.initializers.lecun_normal()


def _seed_from_key(key) -> jax.Array:
  """A uint32 scalar: the last word of a PRNG key's data (a typed key or a
  raw uint32 one)."""
  data = (jax.random.key_data(key)
          if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
  return jnp.ravel(data)[-1].astype(jnp.uint32)


# ---------------------------------------------------------------------------
# The fused context: set by the fused step while it traces the loss.


@dataclasses.dataclass(eq=False)
class FusedContext:
  """What a fused step hands to every ForgeDense it traces.

  Attributes:
    step: int32 scalar, number of updates done so far (0 at the first step).
    implementation: default kernel implementation for layers that name none.
    interpret: run Pallas kernels in interpret mode.
    seed: uint32 scalar, the run's stochastic-rounding seed (each layer mixes
      in a hash of its path).
    backward_traces: module path -> number of times its backward was traced.
    order_updates: finish each fused layer's update before the rest of the
      backward pass reads its dx (see :func:`order_update`); set from
      ``fused_step``'s ``order_updates``.
    stacked: the module paths of the fused layers whose state is stacked
      (nn.scan, ``inplace_scan``). Their kernels never update in place
      (:func:`update_in_place`).
    in_place: whether unstacked fused layers may update in place
      (``fused_step``'s ``in_place``; False: every kernel writes fresh
      outputs).
    audit: print each fused update's distance from the unfused reference
      on the same inputs (``fused_step``'s ``audit``; :func:`audit_update`).
  """

  step: jax.Array
  implementation: str | None = None
  interpret: bool = False
  seed: jax.Array | None = None
  backward_traces: dict[tuple[str, ...], int] = dataclasses.field(
      default_factory=dict)
  order_updates: bool = False
  stacked: frozenset[tuple[str, ...]] = frozenset()
  in_place: bool = False
  audit: bool = False

  def record_backward(self, path: tuple[str, ...]) -> None:
    self.backward_traces[path] = self.backward_traces.get(path, 0) + 1


_LOCAL = threading.local()


def current_context() -> FusedContext | None:
  stack = getattr(_LOCAL, "stack", [])
  return stack[-1] if stack else None


@contextlib.contextmanager
def fused_context(ctx: FusedContext) -> Iterator[FusedContext]:
  """Makes ForgeDense layers traced inside the block run fused."""
  fused_dw.resolve_implementation(ctx.implementation)  # validate early
  stack = getattr(_LOCAL, "stack", None)
  if stack is None:
    stack = _LOCAL.stack = []
  stack.append(ctx)
  try:
    yield ctx
  finally:
    stack.pop()


def _path_prefix() -> tuple[str, ...]:
  return tuple(getattr(_LOCAL, "prefix", ()))


def layer_path(module) -> tuple[tuple[str, ...], str]:
  """A fused layer's full path (under :func:`path_prefix`) and that path as
  text for messages ('<root module>' for the root)."""
  path = _path_prefix() + tuple(module.scope.path)
  return path, "/".join(path) or "<root module>"


def active_context(module) -> FusedContext | None:
  """The fused step's context when ``module`` (a fused layer) runs fused in
  it: inside :func:`fused_context`, with an optimizer, not initializing.
  None: the layer computes what its flax parent computes."""
  ctx = current_context()
  if ctx is None or module.optimizer is None or module.is_initializing():
    return None
  return ctx


@contextlib.contextmanager
def path_prefix(prefix: tuple[str, ...]) -> Iterator[None]:
  """Fused layers traced inside report their paths under ``prefix``.

  For a block applied on its own (``Block(...).apply(variables, x)``, whose
  module paths start at the block) on behalf of a parent that holds its
  variables under ``prefix``; the fused step's bookkeeping uses full paths.
  """
  old = _path_prefix()
  _LOCAL.prefix = old + tuple(prefix)
  try:
    yield
  finally:
    _LOCAL.prefix = old


# ---------------------------------------------------------------------------
# The custom_vjp.


@dataclasses.dataclass(frozen=True, eq=False)
class _Spec:
  """Static description of one fused matmul (hashed by identity)."""

  rule: Any
  compute_dtype: Any
  precision: Any
  implementation: str
  interpret: bool
  context: FusedContext
  path: tuple[str, ...]
  kernel_axes: tuple = (None, None)
  mesh: Any = None
  in_place: bool = False


def _matmul(spec: _Spec, x, kernel):
  # The barrier ties the kernel to this layer's input, so that XLA cannot
  # compute anything from the kernel before the input exists. Without it,
  # XLA's GPU dot merger concatenates the kernels of sibling projections that
  # read the same input (q/k/v) and its scheduler hoists the concatenated
  # copies of every layer to the start of the step: in the unrolled
  # Llama-3.1-8B step, 1.5 GiB of them were live at once at the peak
  # (docs/results.md, "Stop 20"). The barrier moves no data.
  #
  # Not for a stacked layer (scanned, or batched by nn.vmap): a barrier's
  # operand is a buffer of its own, so each slice of a stack stays a copy
  # even where the gemm could read it in place. Without the barrier, and
  # with stop 36's three XLA options, the scanned Llama-3.1-8B step's 480
  # copies (14.3 ms at T=512) were gone (profiled); SCAN_GPU_COMPILER_OPTIONS,
  # now XLA's Triton gemms off alone, gives that step's time and temp (stop
  # 37, not profiled). Without the barrier under XLA's defaults the copies
  # stayed, and so did they with the barrier under the three options
  # (docs/results.md, "Stops 36 and 37").
  if spec.path not in spec.context.stacked:
    x, kernel = lax.optimization_barrier((x, kernel))
  return lax.dot_general(
      x, kernel.astype(spec.compute_dtype), (((x.ndim - 1,), (0,)), ((), ())),
      precision=spec.precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _forge_linear(spec, x, kernel, state, hparams, probe, seed):
  del state, hparams, probe, seed
  return _matmul(spec, x, kernel)


def _forge_linear_fwd(spec, x, kernel, state, hparams, probe, seed):
  return _matmul(spec, x, kernel), (x, kernel, state, hparams, probe, seed)


def _forge_linear_bwd(spec, residuals, dy):
  x, kernel, state, hparams, probe, seed = residuals
  # int8 codes arrive viewed as float8 (see fused_step) and leave the same way.
  state = quantization.from_float_view(state)
  spec.context.record_backward(spec.path)
  # dx reads the old kernel; the fused kernel then overwrites it in place.
  dx = lax.dot_general(
      dy, kernel.astype(spec.compute_dtype),
      (((dy.ndim - 1,), (1,)), ((), ())), precision=spec.precision
  ).astype(x.dtype)
  x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1]).astype(x.dtype)
  new_kernel, new_state = _sharded_update(spec, x2, dy2, kernel, state, hparams, seed)
  if spec.context.audit and spec.kernel_axes == (None, None):
    audit_update(spec, x2, dy2, kernel, state, hparams, seed, new_kernel)
  if spec.context.order_updates:
    dx, new_kernel = order_update(dx, new_kernel)
  return (dx, new_kernel, quantization.as_float_view(new_state),
          jnp.zeros_like(hparams), *probe_and_seed_cotangents(probe, seed, dy))


def audit_update(spec: _Spec, x, dy, kernel, state, hparams, seed, new_kernel):
  """``fused_step(audit=True)``: prints, per fused layer and call, how far
  its new kernel is from the unfused reference's on the same (x, dY) inside
  the same program (``jax.debug.print``): ``err`` = |ΔW - ΔW_ref| / |ΔW_ref|
  (ΔW: the change from the old kernel) and the fraction of weights that
  differ. Same rounding bits, so a correct kernel differs only where fp32
  summation order moves a value across a rounding or quantization boundary.
  For diagnosis: the reference materializes dW."""
  want, _ = fused_dw.fused_dw_update_reference(x, dy, kernel, state, hparams,
                                               rule=spec.rule, seed=seed)
  old = kernel.astype(jnp.float32)
  d_want = want.astype(jnp.float32) - old
  d_got = new_kernel.astype(jnp.float32) - old
  err = jnp.linalg.norm((d_got - d_want).ravel()) / jnp.maximum(
      jnp.linalg.norm(d_want.ravel()), jnp.finfo(jnp.float32).tiny)
  jax.debug.print("forge audit " + ("/".join(spec.path) or "<root module>")
                  + ": err {e:.3e}, weights differing {d:.3e}",
                  e=err, d=jnp.mean(new_kernel != want))


def order_update(dx, new_kernel):
  """``(dx, new_kernel)`` unchanged; dx comes out of a barrier that waits for
  the layer's fused update (``lax.optimization_barrier((dx, new_kernel))``).

  Whatever reads the returned dx (the rest of the backward pass) then runs
  after the layer's fused update. Without it XLA's scheduler ran some
  updates early, before their own dx matmul, and so kept copies of those
  kernels (dx needs the old values) from the step's start: in the unrolled
  Llama-3.1-8B int8 step on the H200, 1.5 GiB live at the peak and a 3.32
  GiB temp allocation; with it no copies, 1.54 GiB of temp and a 32.92 GiB
  peak against 34.17 (docs/results.md, "Stop 21"). A barrier before the
  update instead, on (dx, kernel), also removed the copies, but XLA then put
  off every update to the end of the backward, holding every layer's inputs
  of the update (such as x transposed for the kernel): 7.34 GiB of temp.

  The new kernel returned is the update's own result, not the barrier's:
  taken from the barrier, it no longer went straight into the scanned
  stack's ``dynamic_update_slice``, and XLA's dynamic-slice fusion then gave
  the in-place Mosaic kernel different operand and result addresses (NaN
  from the second step, stop 21; found in stop 22, when scanned layers still
  updated in place). As written, every leaf after one ordered step equalled
  the unordered step's on the H200 (2 scanned layers, in place). On the
  GPU's XLA reference path the two may differ by fp32 rounding (the rest of
  the backward fused differently). ``fused_step``'s ``order_updates``
  applies it to unstacked layers by default: with scanned layers it gave
  more temp (2.08 GiB against 1.86, Llama-3.1-8B, int8 moments).
  """
  dx, _ = lax.optimization_barrier((dx, new_kernel))
  return dx, new_kernel


def probe_and_seed_cotangents(probe, seed, dy):
  """The cotangents a fused layer's backward returns for its probe and seed.

  The probe's counts how often this backward ran (1 when used exactly once).
  Adding a zero that depends on dy makes it batched wherever dy is, so under
  vmap the count is summed over the batch like the weight's cotangent. The
  integer seed gets a float0 zero (None when there is no seed).
  """
  probe_ct = jnp.ones_like(probe) + jnp.sum(dy[..., :0]).astype(probe.dtype)
  seed_ct = None if seed is None else np.zeros(np.shape(seed), jax.dtypes.float0)
  return probe_ct, seed_ct


_forge_linear.defvjp(_forge_linear_fwd, _forge_linear_bwd)


def update_in_place(ctx: FusedContext, path: tuple[str, ...]) -> bool:
  """Whether the fused layer at ``path`` may update its kernel and state in
  their own buffers (``fused_dw_update``'s ``in_place``).

  Only when the step allows it (``ctx.in_place``: each state leaf is a whole
  argument of the jitted step) and the layer's state is not stacked. A
  stacked layer's kernel is a slice of its stack, and on the H200 XLA's GPU
  dynamic-slice fusion gave the in-place Mosaic kernel different operand and
  result addresses, and wrong results, whenever the new kernel did not go
  straight back into that slice: under a plain ``nn.scan`` (the new kernels
  collected into a new stack), and in ``inplace_scan`` when anything sat
  between the slice and the kernel (``jax.checkpoint``'s barrier on a
  rematerialized layer's inputs; docs/results.md, "Stop 22"). With fresh
  outputs it was right in every pattern tried, and where the new kernel
  does go back into its slice (``inplace_scan``) XLA wrote it there with no
  extra temp.
  """
  return ctx.in_place and path not in ctx.stacked


def _sharded_update(spec: _Spec, x, dy, kernel, state, hparams, seed):
  """The fused update, per shard of the kernel under tensor parallelism.

  With ``kernel_axes = (a_in, a_out)`` the kernel (in, out) is split over the
  mesh axes a_in (rows) and/or a_out (columns). Each device's dW shard needs
  only its slice of x (T, in) and dY (T, out): xᵀ[rows]·dY[:, cols], so it
  is computed and applied where the shard lives, with no communication.
  The state is split like the kernel (a state narrower than the kernel, e.g.
  folded moments, along the same axes); stochastic rounding uses each
  element's global index, so the result equals the unsharded update.
  """
  a_in, a_out = spec.kernel_axes
  d_in, d_out = kernel.shape
  kw = dict(rule=spec.rule, implementation=spec.implementation,
            interpret=spec.interpret, in_place=spec.in_place)
  if a_in is None and a_out is None:
    return fused_dw.fused_dw_update(x, dy, kernel, state, hparams, seed=seed, **kw)
  P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name
  sizes = dict(spec.mesh.shape)
  n_in = sizes[a_in] if a_in else 1
  n_out = sizes[a_out] if a_out else 1
  w_spec = P(a_in, a_out)

  def local(x, dy, kernel, state, hparams, *seed):
    row0 = lax.axis_index(a_in) * (d_in // n_in) if a_in else 0
    col0 = lax.axis_index(a_out) * (d_out // n_out) if a_out else 0
    return fused_dw.fused_dw_update(
        x, dy, kernel, state, hparams, seed=seed[0] if seed else None,
        index_offset=(row0, col0), index_width=d_out, **kw)

  state_specs = tuple(quantization.sharded_like(s, w_spec) for s in state)
  seeds = () if seed is None else (seed,)
  return jax.shard_map(
      local, mesh=spec.mesh,
      in_specs=(P(None, a_in), P(None, a_out), w_spec, state_specs, P(),
                *(P() for _ in seeds)),
      out_specs=(w_spec, state_specs), check_vma=False,
  )(x, dy, kernel, state, hparams, *seeds)


def fused_param(module, name: str, init, shape):
  """``module.param(name, init, shape, module.param_dtype)``, and the list
  of keys ``init`` was called with: its key when this call creates the param,
  empty when it exists already (flax then checks its shape by evaluating
  ``init`` abstractly, whose key must not escape)."""
  keys = []

  def recording_init(key, *args):
    keys.append(key)
    return init(key, *args)

  creating = not module.has_variable("params", name)
  value = module.param(name, recording_init if creating else init, shape,
                       module.param_dtype)
  return value, keys


def create_fused_state(module, shape, keys, scale_transposed: bool = False) -> None:
  """Creates a fused layer's ``forge_state`` variables (when ``module`` has
  an optimizer and the collection is mutable, i.e. in ``model.init``): the
  optimizer's state for a param of ``shape``, the probe, and for a bfloat16
  param with ``stochastic_rounding`` its ``rounding_seed``.

  The seed is a word of the key the param was drawn with (``keys`` from
  :func:`fused_param`; layers stacked by nn.scan get one seed each, like
  their params), or of a params rng drawn after the layer's params when they
  exist already (their values stay flax's). A word of the key, not
  ``jax.random.bits`` of it: one more threefry per layer made up 45% of the
  XLA compile time of an unrolled Llama-3.1-8B's init (CPU).
  ``scale_transposed``: int8 states keep their scales transposed
  (``quantization.QuantizedArray.scale_transposed``).
  """
  optimizer = module.optimizer
  if optimizer is None or not module.is_mutable_collection(FORGE_STATE):
    return  # a plain apply without the collection is the flax layer
  for name in optimizer.rule.state_names:
    module.variable(FORGE_STATE, name,
                    lambda n=name: optimizer.init_state(
                        shape, scale_transposed)[n])
  module.variable(FORGE_STATE, PROBE, jnp.zeros, (), jnp.float32)
  if (jnp.dtype(module.param_dtype) == jnp.bfloat16
      and module.stochastic_rounding):
    module.variable(FORGE_STATE, ROUNDING_SEED, lambda: _seed_from_key(
        keys[0] if keys else module.make_rng("params")))


# ---------------------------------------------------------------------------
# The layer.


class ForgeDense(nn.Module):
  """A drop-in ``flax.linen.Dense`` with FORGE's fused optimizer update.

  y = x · kernel + bias, for inputs of shape (..., in) and kernel (in, features).
  Fields up to ``promote_dtype`` are those of ``flax.linen.Dense`` with the
  same defaults and parameter names (``kernel``, ``bias``).

  The kernel's optimizer state (e.g. AdamW's ``mu`` and ``nu``, AdaGrad's
  ``sum_of_squares``, SGD momentum's ``trace``; shape (in, features), stored
  as the optimizer's ``mu_dtype``/``nu_dtype``...: float32, bfloat16 or an
  int8 ``QuantizedArray``) lives in the variable collection
  ``'forge_state'`` with a scalar ``probe`` that counts backward passes.
  ``model.init`` creates it.

  In a fused step (:func:`forge_jax.make_train_step`) the backward pass
  computes dx with the old kernel, then dW = xᵀ·dY tile by tile with
  ``optimizer``'s update applied in registers (FORGE, arXiv 2606.22932); the
  bias is not fused and gets an ordinary gradient. Outside a fused step the
  layer is exactly ``flax.linen.Dense``.

  Attributes:
    features: the number of output features.
    use_bias: whether to add a bias (not fused; trained by the step's optax tx).
    dtype: the computation dtype (default: inferred from inputs and params).
    param_dtype: dtype of kernel and bias; float32 or bfloat16 in fused mode
      (a bfloat16 kernel is updated in fp32 and written back rounded).
    precision: numerical precision of the forward matmul and dx.
    kernel_init: initializer of the kernel, (in, features).
    bias_init: initializer of the bias, (features,).
    promote_dtype: as in ``flax.linen.Dense``.
    dot_general, dot_general_cls: as in ``flax.linen.Dense``; only without an
      optimizer (a fused layer computes its own matmuls).
    optimizer: a :class:`forge_jax.ForgeTransformation` (``forge_jax.adamw``,
      ``nadamw``, ``radam``, ``lion``, ``rmsprop``, ``adagrad``, ``sgd``) run
      fused on the kernel. ``None`` makes a
      plain Dense without optimizer state, in a fused step too (its kernel is
      then trained by the step's optax ``tx``).
    implementation: ``'xla'``, ``'triton'``, ``'mosaic'`` (the Mosaic GPU
      kernel: bf16 activations, tile-divisible shapes; folded moments
      in fp32 or bf16 with fold_level >= 3;
      see ``pallas_kernels.fused_dw.kernel_mosaic``), ``'auto'`` (on a GPU:
      Mosaic on Hopper with jax >= 0.11 where it covers the op, else
      Triton: ``pallas_kernels.fused_dw.api.select_kernel``) or ``None``
      (the fused step's choice, else ``'auto'`` on a GPU and the reference
      elsewhere).
    stochastic_rounding: write a bfloat16 kernel back with stochastic
      rounding (unbiased; random bits from the run's seed, this layer's
      ``rounding_seed`` variable, the step count and the element index), else
      round to nearest. ``rounding_seed`` (uint32) is a word of the key the
      kernel is initialized with (no random draw of its own, so the params
      are flax Dense's), or of a ``'params'`` rng when ``forge_state`` is
      made for params that exist already. Only the fused kernel: the bias
      and other unfused params are rounded by the step's optax ``tx`` (to
      nearest).
    kernel_axes: tensor parallelism: the mesh axis names ``(in_axis,
      out_axis)`` over which the kernel's rows and/or columns are split,
      e.g. ``(None, 'model')`` column-parallel (Megatron's first MLP matmul)
      or ``('model', None)`` row-parallel (its second). In a fused step run
      under ``with jax.set_mesh(mesh):`` each device then computes its own
      dW shard from its slices of x and dY and updates its kernel and state
      shards in place (``jax.shard_map``), no all-reduce needed; the result
      equals the unsharded step. Each axis must divide the kernel (and its
      state: fold blocks and int8 blocks of 64 may not cross shards).

  Raises (at trace time, before anything is computed):
    TypeError: if ``optimizer`` is not a ForgeTransformation.
    ValueError: if ``optimizer`` is combined with a custom ``dot_general``;
      in a fused step, if the layer has no state, the computation dtype is not
      float32 or bfloat16, ``param_dtype`` is not float32 or bfloat16, the
      stored state's dtype is not the optimizer's, or the layer runs
      under ``shard_map``/``pmap``/a named ``vmap`` axis or an unnamed
      ``vmap`` that batches its inputs but not its kernel (each would sum or
      split the fused update: data parallelism needs an all-reduce of dW);
      if the context mesh has an axis of size > 1 that is not in
      ``kernel_axes`` (data parallelism, refused for the same reason), or
      ``kernel_axes`` names an axis the mesh lacks, or does not divide the
      kernel or its state.
  """

  features: int
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Any = default_kernel_init
  bias_init: Any = nn.initializers.zeros_init()
  promote_dtype: Any = promote_dtype
  dot_general: Any = None
  dot_general_cls: Any = None
  optimizer: transforms_lib.ForgeTransformation | None = None
  implementation: str | None = None
  stochastic_rounding: bool = True
  kernel_axes: tuple = (None, None)

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Applies y = inputs · kernel + bias: (..., in) -> (..., features)."""
    if self.optimizer is not None and not isinstance(
        self.optimizer, transforms_lib.ForgeTransformation):
      raise TypeError(
          f"ForgeDense.optimizer must be a forge_jax fused transformation such "
          f"as forge_jax.adamw(...), got {type(self.optimizer).__name__} (an "
          "optax transformation, or forge_jax.fold_adam with mask=, which "
          "picks leaves of a params tree and so runs unfused only: give a "
          "layer that should not decay weight_decay=0.0)")
    if self.implementation is not None:
      fused_dw.resolve_implementation(self.implementation)
    if self.optimizer is None and tuple(self.kernel_axes) != (None, None):
      raise ValueError(
          f"ForgeDense.kernel_axes={tuple(self.kernel_axes)} needs an optimizer:"
          " without one the layer is a plain Dense, whose kernel jax.jit "
          "shards like any other array")
    if not isinstance(self.features, numbers.Integral) or self.features < 1:
      raise ValueError(f"ForgeDense.features={self.features!r} must be a "
                       "positive int")
    if self.optimizer is not None and (self.dot_general is not None or
                                       self.dot_general_cls is not None):
      raise ValueError("ForgeDense: a custom dot_general/dot_general_cls "
                       "cannot be combined with optimizer (the fused layer "
                       "computes its own matmuls)")
    if jnp.ndim(inputs) < 1:
      raise ValueError("ForgeDense inputs must have at least 1 dimension (..., "
                       f"in), got shape {jnp.shape(inputs)}")
    kernel, kernel_keys = fused_param(
        self, "kernel", self.kernel_init,
        (jnp.shape(inputs)[-1], self.features))
    bias = (self.param("bias", self.bias_init, (self.features,),
                       self.param_dtype) if self.use_bias else None)
    # int8 moments with their scales in the kernels' layout (quantization's
    # "Scale layout"): no transposes around each update, none of layer stacks.
    create_fused_state(self, kernel.shape, kernel_keys, scale_transposed=True)

    ctx = active_context(self)
    inputs, kernel_c, bias = self.promote_dtype(
        inputs, kernel, bias, dtype=self.dtype)
    if ctx is None:
      if self.dot_general_cls is not None:
        dot_general = self.dot_general_cls()
      else:
        dot_general = self.dot_general or lax.dot_general
      y = dot_general(inputs, kernel_c, (((inputs.ndim - 1,), (0,)), ((), ())),
                      precision=self.precision)
    else:
      y = self._fused_matmul(ctx, inputs, kernel.dtype)
    if bias is not None:
      y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
    return y

  def _fused_matmul(self, ctx: FusedContext, inputs, param_dtype):
    path, where = layer_path(self)
    if inputs.dtype not in (jnp.float32, jnp.bfloat16):
      raise ValueError(f"ForgeDense at {where!r}: the computation dtype "
                       f"{inputs.dtype} (from inputs and dtype={self.dtype}) "
                       "must be float32 or bfloat16 in fused mode")
    kernel, state, probe, seed = fused_variables(
        self, "ForgeDense", where, KERNEL_INPUT, param_dtype, ctx, inputs)
    rule = self.optimizer.rule
    mesh = _check_kernel_axes(f"ForgeDense at {where!r}", self.kernel_axes,
                              kernel.shape, state, rule)
    implementation = fused_dw.resolve_implementation(
        self.implementation or ctx.implementation)
    spec = _Spec(rule=rule, compute_dtype=inputs.dtype,
                 precision=self.precision, implementation=implementation,
                 interpret=ctx.interpret, context=ctx, path=path,
                 kernel_axes=tuple(self.kernel_axes), mesh=mesh,
                 in_place=update_in_place(ctx, path))
    hparams = self.optimizer.packed_hyperparams(ctx.step)
    return _forge_linear(spec, inputs, kernel, state, hparams, probe, seed)


def fused_variables(module, layer: str, where: str, input_name: str,
                    param_dtype, ctx: FusedContext, inputs):
  """What a fused layer (ForgeDense, ForgeEmbed) reads in a fused step.

  Returns ``(weight, state, probe, seed)``: the copy of the fused param the
  step hands over as ``forge_state/<input_name>``, the optimizer's state
  arrays, the probe, and the stochastic-rounding seed (uint32; None for an
  fp32 weight or without ``stochastic_rounding``).

  Raises:
    ValueError: naming ``layer`` and ``where``, if ``param_dtype`` is not
      float32 or bfloat16, a variable is missing, a state is stored in
      another dtype than the optimizer's, or the layer runs under mapped
      axes (:func:`_refuse_parallel_axes`).
  """
  if jnp.dtype(param_dtype) not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f"{layer} at {where!r}: param_dtype={param_dtype} is "
                     "not supported in fused mode; use float32 or bfloat16")
  optimizer = module.optimizer
  rule = optimizer.rule
  names = (*rule.state_names, PROBE)
  missing = [n for n in names if not module.has_variable(FORGE_STATE, n)]
  if missing:
    raise ValueError(
        f"{layer} at {where!r} has no {FORGE_STATE!r} variables {missing}:"
        f" pass the {FORGE_STATE!r} collection returned by model.init (e.g. "
        "TrainState.create(..., variables=model.init(...))), and "
        "train through forge_jax.fused_step / make_train_step")
  if not module.has_variable(FORGE_STATE, input_name):
    # the step itself hands the param over as forge_state/<input_name>
    raise ValueError(
        f"{layer} at {where!r}: the fused backward runs only inside "
        "forge_jax.fused_step / make_train_step (this call did not come "
        "from one)")
  weight = module.get_variable(FORGE_STATE, input_name)
  _refuse_parallel_axes(f"{layer} at {where!r}", inputs, weight)
  state = tuple(module.get_variable(FORGE_STATE, n) for n in rule.state_names)
  want = tuple(rule.state_shape(jnp.shape(weight)))
  for n, s, d in zip(rule.state_names, state, optimizer.state_dtypes):
    if quantization.state_storage_dtype(s) != d:
      raise ValueError(
          f"{layer} at {where!r}: {FORGE_STATE}/{n} is stored as "
          f"{quantization.state_storage_dtype(s)} but the optimizer's "
          f"{n}_dtype is {d}: the state comes from another optimizer "
          "configuration (re-run model.init)")
    got = tuple(s.shape)  # an int8 state's: its codes'
    if got != want:
      raise ValueError(
          f"{layer} at {where!r}: {FORGE_STATE}/{n} has shape {got}, but "
          f"this layer's rule {rule.name!r} keeps {want} for its "
          f"{jnp.shape(weight)} {input_name}: the state comes from "
          "another optimizer, fold level or width (re-run model.init)")
  seed = None
  if jnp.dtype(param_dtype) == jnp.bfloat16 and module.stochastic_rounding:
    if not module.has_variable(FORGE_STATE, ROUNDING_SEED):
      raise ValueError(
          f"{layer} at {where!r} has no {FORGE_STATE}/{ROUNDING_SEED}: "
          "initialize the model with param_dtype=bfloat16 (model.init)")
    base = jnp.uint32(0) if ctx.seed is None else ctx.seed
    seed = (jnp.asarray(base, jnp.uint32)
            ^ module.get_variable(FORGE_STATE, ROUNDING_SEED))
  return weight, state, module.get_variable(FORGE_STATE, PROBE), seed


def _refuse_parallel_axes(who: str, inputs, kernel) -> None:
  """Refuses transformations under which the fused update would be wrong."""
  mesh = jax.sharding.get_abstract_mesh()
  manual = tuple(getattr(mesh, "manual_axes", ()) or ())
  named = tuple(_axis_names())
  if manual or named:
    raise ValueError(
        f"{who} runs under the mapped axes "
        f"{sorted(set(manual) | set(named))} (shard_map, pmap or a named "
        "vmap). Not supported: over a data-parallel axis each shard would "
        "apply its own partial gradient, where the update needs the "
        "all-reduced dW. Use jax.jit with sharded arrays instead")
  if fused_dw.is_batched(inputs) and not fused_dw.is_batched(kernel):
    raise ValueError(
        f"{who} runs under jax.vmap/nn.vmap with its inputs "
        "batched and its kernel shared: the per-example fused updates would be "
        "summed. Compute the loss on the whole batch instead")


def _check_kernel_axes(who, kernel_axes, shape, state, rule):
  """Validates tensor-parallel ``kernel_axes`` against the context mesh.

  Returns the (abstract) mesh, or None without sharding. Refuses any mesh
  axis of size > 1 that does not split the kernel: over such an axis
  (data parallelism) each device would hold a whole copy of the kernel and
  see only part of the batch, and the update needs dW all-reduced across it
  first, which the fused kernel cannot do.
  """
  if not (isinstance(kernel_axes, (tuple, list)) and len(kernel_axes) == 2
          and all(a is None or isinstance(a, str) for a in kernel_axes)):
    raise ValueError(
        f"{who}: kernel_axes={kernel_axes!r} must be a pair "
        "(in_axis, out_axis) of mesh axis names or None")
  mesh = jax.sharding.get_abstract_mesh()
  sizes = mesh_axis_sizes()
  named = [a for a in kernel_axes if a is not None]
  for a in named:
    if sizes and a not in sizes:
      raise ValueError(
          f"{who}: kernel_axes names {a!r}, which is not an "
          f"axis of the mesh {list(sizes)}")
  data_axes = sorted(a for a, n in sizes.items() if n > 1 and a not in named)
  if data_axes:
    raise ValueError(
        f"{who}: the mesh has the axes {data_axes} of size > 1"
        f" that do not split the kernel (kernel_axes={tuple(kernel_axes)}). "
        "Data parallelism over them is not supported by the fused update: "
        "each device would hold the whole kernel shard but only part of the "
        "batch, and the optimizer step needs dW all-reduced over those axes "
        "first. Use a mesh whose axes of size > 1 are all in kernel_axes "
        "(tensor parallelism), or the unfused optax path for data parallelism")
  if not named:
    return None
  if not sizes:
    raise ValueError(
        f"{who}: kernel_axes={tuple(kernel_axes)} needs a "
        "mesh: run the step under `with jax.set_mesh(mesh):`")
  if len(set(named)) != len(named):
    raise ValueError(f"{who}: kernel_axes={tuple(kernel_axes)}"
                     " names the same mesh axis twice")
  types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ()) or ()))
  explicit = [a for a in named
              if a in types and types[a] != jax.sharding.AxisType.Auto]
  if explicit:
    raise ValueError(
        f"{who}: kernel_axes needs mesh axes of type Auto, "
        f"but {explicit} are {[str(types[a]) for a in explicit]}: make the mesh "
        "with jax.make_mesh(..., axis_types=(jax.sharding.AxisType.Auto, ...))")
  n = [sizes[a] if a else 1 for a in kernel_axes]
  if shape[0] % n[0] or shape[1] % n[1]:
    raise ValueError(
        f"{who}: the kernel {tuple(shape)} does not split "
        f"evenly over kernel_axes={tuple(kernel_axes)} of sizes {tuple(n)}")
  local = (shape[0] // n[0], shape[1] // n[1])
  full_state = rule.state_shape(tuple(shape))
  local_state = rule.state_shape(local)
  if (local_state[0] * n[0], local_state[1] * n[1]) != tuple(full_state):
    raise ValueError(
        f"{who}: the optimizer state {tuple(full_state)} does "
        f"not split into shards {local_state} of the kernel shards {local} "
        "(a fold block would cross a shard boundary)")
  if quantization.any_quantized(state) and (
      local_state[1] % quantization.BLOCK_SIZE and n[1] > 1):
    raise ValueError(
        f"{who}: int8 state needs each column shard's state "
        f"width ({local_state[1]}) to be a multiple of "
        f"{quantization.BLOCK_SIZE} (quantization blocks may not cross shards)")
  return mesh


def mesh_axis_sizes() -> dict:
  """{axis name: size} of the context mesh (``jax.set_mesh``); {} without."""
  mesh = jax.sharding.get_abstract_mesh()
  return {} if getattr(mesh, "empty", True) else dict(mesh.shape)


def _axis_names():
  try:
    from jax._src import core as jax_core  # pylint: disable=g-import-not-at-top
    return jax_core.unsafe_get_axis_names()
  except (ImportError, AttributeError):  # older/newer jax: skip this check
    return ()


"""The fused training step: params, fused-layer state and optax state together."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax import traverse_util

from forge_jax._src import dense as dense_lib
from pallas_kernels import quantization
from pallas_kernels.fused_dw import kernel_mosaic

FORGE_STATE = dense_lib.FORGE_STATE
PROBE = dense_lib.PROBE

LossFn = Callable[[Mapping[str, Any], Any], Any]


def fused_kernel_paths(forge_state: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
  """Module paths of the fused layers found in a ``'forge_state'`` collection."""
  flat = traverse_util.flatten_dict(dict(forge_state))
  return tuple(sorted(k[:-1] for k in flat if k[-1] == PROBE))


FUSED_PARAM_NAMES = ("kernel", "embedding")
"""The param a fused layer updates in its backward pass: ForgeDense's
``kernel``, ForgeEmbed's ``embedding``. The fused step hands it to the layer
a second time as ``forge_state/<layer>/<the same name>``."""


def fused_param_keys(flat, paths) -> tuple[tuple[str, ...], ...]:
  """The key (path + name) in ``flat``, params flattened by
  ``flax.traverse_util.flatten_dict``, of each fused layer's param.

  Raises:
    ValueError: if a path has none or several of :data:`FUSED_PARAM_NAMES`.
  """
  keys = []
  for p in paths:
    found = [p + (n,) for n in FUSED_PARAM_NAMES if p + (n,) in flat]
    if len(found) != 1:
      what = "no" if not found else "more than one"
      raise ValueError(
          f"params has {what} fused param ({' or '.join(FUSED_PARAM_NAMES)}) "
          f"for the fused layer {'/'.join(p) or '<root module>'!r} found in "
          f"{FORGE_STATE!r}: params and {FORGE_STATE!r} must come from the "
          "same model.init")
    keys.append(found[0])
  return tuple(keys)


def split_params(params, paths):
  """Splits params into (unfused tree, {path + (name,): fused param}), name
  ``'kernel'`` (ForgeDense) or ``'embedding'`` (ForgeEmbed)."""
  flat = traverse_util.flatten_dict(dict(params))
  keys = set(fused_param_keys(flat, paths))
  fused = {k: flat[k] for k in keys}
  other = traverse_util.unflatten_dict(
      {k: v for k, v in flat.items() if k not in keys})
  return other, fused


def merge_params(other, fused):
  flat = traverse_util.flatten_dict(dict(other))
  flat.update(fused)
  return traverse_util.unflatten_dict(flat)


_WALK_LIMIT = 100_000
"""Objects :func:`_callables_in` visits at most (an optax transformation of
a large model has a few thousand)."""


def _callables_in(root):
  """Callables reachable from ``root`` through closures and containers.

  An optax transformation is a pair of closures; its parts (a chain's list, a
  ``multi_transform``'s dict, a ``named_chain``'s tuples, a
  ``functools.partial``'s arguments) live in closure cells, so this walk finds
  the functions of every nested transformation, at any depth (each object is
  visited once, at most :data:`_WALK_LIMIT` objects). Attributes are read
  with ``inspect.getattr_static``, so an object whose ``__getattr__`` makes
  new attributes on demand (a ``unittest.mock.MagicMock``) is not expanded
  without end.
  """
  seen, stack = {}, [root]  # id -> object: kept alive, so no id is reused
  while stack and len(seen) < _WALK_LIMIT:
    obj = stack.pop()
    if id(obj) in seen:
      continue
    seen[id(obj)] = obj
    if isinstance(obj, dict):
      stack.extend(obj.values())
      continue
    if isinstance(obj, (tuple, list)):
      stack.extend(obj)
      continue
    if not callable(obj):
      continue
    yield obj
    if isinstance(obj, functools.partial):
      stack.extend((obj.func, obj.args, obj.keywords))
      continue
    if isinstance(obj, types.MethodType):
      stack.append(obj.__func__)
      continue
    for attr in ("fn", "func", "update", "init", "__wrapped__"):  # wrappers
      try:
        inner = inspect.getattr_static(obj, attr)
      except AttributeError:
        continue
      if isinstance(inner, (staticmethod, classmethod)):
        inner = inner.__func__
      if callable(inner):
        stack.append(inner)
    if isinstance(obj, types.FunctionType):
      for cell in obj.__closure__ or ():
        try:
          stack.append(cell.cell_contents)
        except ValueError:  # an empty cell
          continue


# optax transformations whose meaning needs the fused layers' gradients, or
# that would silently leave the fused layers out.
_REFUSED_TX = {
    "clip_by_global_norm": (
        "the global norm needs every gradient before any update, but fused "
        "kernels update inside the backward pass and their gradients never "
        "exist. Clip per tensor (optax.clip_by_block_rms) or train unfused"),
    "apply_if_finite": (
        "it skips a step with a non-finite gradient, but the fused kernels "
        "have already been updated by then"),
    "reduce_on_plateau": (
        "it would scale the updates of tx's params only, while the fused "
        "layers kept their learning rate (set in ForgeDense's optimizer; "
        "give both the same schedule instead)"),
}


def _refused_name(qualname: str) -> str | None:
  for name in _REFUSED_TX:
    if qualname == name or qualname.startswith(name + "."):
      return name
  return None


def _init_watching_optax(tx, params):
  """``tx.init(params)``; and what optax built or called while it ran.

  ``optax.inject_hyperparams(factory)`` builds its inner transformation
  inside ``init`` (and again in every ``update``), so what the factory
  returns is not reachable from ``tx`` before that call. A profile hook on
  this thread records every transformation a call returns and the optax
  functions called. It stands aside when another profile hook is active
  (cProfile on Python 3.11 sets one that ``sys.setprofile`` could not put
  back); then only ``tx``'s own closures are walked.

  Returns:
    ``(opt_state, transformations built, qualified names of optax functions
    called)``.
  """
  built, called = [], set()

  def hook(frame, event, arg):
    if event == "call":
      if frame.f_globals.get("__name__", "").startswith("optax"):
        code = frame.f_code
        called.add(getattr(code, "co_qualname", code.co_name))
    elif event == "return" and isinstance(arg, optax.GradientTransformation):
      built.append(arg)

  if sys.getprofile() is not None:
    return tx.init(params), built, called
  sys.setprofile(hook)
  try:
    opt_state = tx.init(params)
  finally:
    sys.setprofile(None)
  return opt_state, built, called


def _refuse_unsupported_tx(tx, opt_state, built=(), called=()) -> None:
  """Refuses optax pieces whose meaning needs the fused layers' gradients:
  in ``tx``, in the transformations ``built`` while ``tx.init`` ran, or
  ``called`` then (their constructors)."""
  for leaf in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.MultiStepsState)):
    if isinstance(leaf, optax.MultiStepsState):
      raise ValueError(
          "tx: gradient accumulation (optax.MultiSteps) cannot be combined "
          "with fused ForgeDense layers: their update runs inside every "
          "backward pass, so there is no gradient to accumulate")
  names = [getattr(f, "__qualname__", "") for f in _callables_in((tx, built))]
  for qualname in (*names, *sorted(called)):
    name = _refused_name(qualname)
    if name is not None:
      raise ValueError(f"tx: optax.{name} cannot be combined with fused "
                       f"ForgeDense layers: {_REFUSED_TX[name]}")


class TrainState(struct.PyTreeNode):
  """Training state of a model with fused ForgeDense layers.

  Like ``flax.training.train_state.TrainState``, with the fused layers'
  optimizer state kept beside the params.

  Attributes:
    step: int32 scalar, number of completed steps.
    params: the model's ``'params'`` collection (fused kernels included).
    forge_state: the ``'forge_state'`` collection: per fused layer its
      optimizer state (shaped like the kernel: fp32, bf16 or int8
      ``QuantizedArray``), a probe, and for bf16 kernels a rounding seed.
    opt_state: state of ``tx`` over the params that are *not* fused kernels
      (embeddings, norms, biases, heads).
    seed: uint32 scalar, the run's stochastic-rounding seed for bfloat16
      fused kernels, combined with each layer's ``rounding_seed`` (both are
      saved in checkpoints, so a resumed run rounds identically).
    apply_fn: the model's apply function (static).
    tx: optax transformation for the unfused params (static).
  """

  step: jax.Array
  params: Any
  forge_state: Any
  opt_state: optax.OptState
  seed: jax.Array
  apply_fn: Callable = struct.field(pytree_node=False)
  tx: optax.GradientTransformation = struct.field(pytree_node=False)

  @classmethod
  def create(cls, *, apply_fn: Callable, variables: Mapping[str, Any] | None = None,
             tx: optax.GradientTransformation, seed: int = 0,
             params: Any = None) -> "TrainState":
    """Builds the state from ``model.init``'s variables.

    Args:
      apply_fn: usually ``model.apply``.
      variables: ``{'params': ..., 'forge_state': ...}`` from ``model.init``.
      tx: optax transformation for every param that is not a fused kernel.
      seed: the stochastic-rounding seed, a non-negative int below 2**32.
      params: not taken (flax's ``TrainState.create(params=...)``): refused
        with a pointer to ``variables``, which carries the fused layers'
        ``forge_state`` beside the params.

    Raises:
      ValueError: if ``params=`` is given or ``variables`` is missing, if
        ``variables`` lacks ``'params'`` or holds collections
        other than ``'params'`` and ``'forge_state'``, or the model has fused
        layers and ``tx`` holds gradient accumulation (``optax.MultiSteps``),
        global-norm clipping (``optax.clip_by_global_norm``) or
        ``optax.apply_if_finite``, which need the fused layers' gradients,
        or ``optax.contrib.reduce_on_plateau``, which would leave the fused
        layers' learning rate alone. The check walks the transformation's
        closures at any depth, so it finds these inside chains,
        ``named_chain``, ``multi_transform``, ``masked`` and ``partition``,
        and watches ``tx.init`` (a profile hook) for the transformations
        built and the optax constructors called while it runs, so it finds
        them inside an ``optax.inject_hyperparams`` factory too (unless
        another profile hook is active, such as cProfile on Python 3.11, or
        ``tx.init`` runs no Python, such as a cached ``jax.jit`` of it).
      Whatever ``tx.init`` raises on the params without the fused kernels
      (e.g. a mask or label tree built from all params, fused kernels
      included: pass a callable) is raised with a note saying so.
    """
    if params is not None or variables is None:
      raise ValueError(
          "TrainState.create takes variables=model.init(...), the whole dict "
          "with its 'params' and 'forge_state' collections (the fused layers' "
          "optimizer state lives in 'forge_state'), not params=")
    if not isinstance(variables, Mapping) or "params" not in variables:
      got = sorted(variables) if isinstance(variables, Mapping) else type(variables).__name__
      raise ValueError("variables must hold a 'params' collection (from "
                       f"model.init), got {got}")
    others = sorted(set(variables) - {"params", FORGE_STATE})
    if others:
      raise ValueError(
          f"variables holds the collections {others}, which TrainState does not "
          "carry (the fused step has no mutable collections such as "
          "batch_stats); they would be silently dropped. Use a model without "
          "them (e.g. LayerNorm instead of BatchNorm)")
    if (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
        or not 0 <= seed < 2**32):
      raise ValueError(f"seed={seed!r} must be an int in [0, 2**32)")
    params = variables["params"]
    forge_state = variables.get(FORGE_STATE, {})
    paths = fused_kernel_paths(forge_state)
    other, _ = split_params(params, paths)
    if paths:
      try:
        opt_state, built, called = _init_watching_optax(tx, other)
      except (ValueError, TypeError) as e:
        e.add_note(
            "forge_jax: tx.init ran on the params without the kernels of the "
            f"{len(paths)} fused layer(s) (such as "
            f"{'/'.join(paths[0]) or '<root module>'!r}): tx sees only the "
            "params that are not fused kernels. A mask or label tree built "
            "from all of variables['params'] does not match them; pass a "
            "callable instead (optax's mask=fn, multi_transform(transforms, "
            "fn)).")
        raise
      _refuse_unsupported_tx(tx, opt_state, built, called)
    else:
      opt_state = tx.init(other)
    return cls(step=jnp.zeros([], jnp.int32), params=params,
               forge_state=forge_state, opt_state=opt_state,
               seed=jnp.asarray(seed, jnp.uint32), apply_fn=apply_fn, tx=tx)

  @property
  def variables(self) -> dict[str, Any]:
    """``{'params': ..., 'forge_state': ...}`` for ``apply_fn``."""
    return {"params": self.params, FORGE_STATE: self.forge_state}


def fused_step(
    state: TrainState,
    batch: Any,
    loss_fn: LossFn,
    *,
    implementation: str | None = None,
    interpret: bool = False,
    order_updates: bool | None = False,
    in_place: bool = False,
    audit: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One training step; fused layers update inside their backward pass.

  Args:
    state: the :class:`TrainState`.
    batch: passed to ``loss_fn`` unchanged.
    loss_fn: ``loss_fn(variables, batch) -> loss`` or ``(loss, aux)``, where
      ``variables`` is ``{'params': ..., 'forge_state': ...}`` to pass to
      ``apply_fn``; ``loss`` an fp32 scalar, ``aux`` a dict of metrics (its
      entries join the returned metrics) or any other pytree (returned as
      ``metrics['aux']``, e.g. the logits).
    implementation: kernel implementation for fused layers that name none.
    interpret: run the Pallas kernels in interpret mode.
    order_updates: finish each fused layer's update before the rest of the
      backward pass reads its dx (an ``optimization_barrier`` on the layer's
      dx and new kernel, :func:`forge_jax._src.dense.order_update`; it
      changes no value): XLA's GPU scheduler then keeps no copies of
      kernels, 1.25 GiB less at the unrolled Llama-3.1-8B step's peak on the
      H200. True: on; False: off; None: on unless a fused layer's state is
      stacked (scanned layers: there it gave 2.08 GiB of temp against 1.86
      without it, Llama-3.1-8B, int8 moments). False by default here, as it
      was measured only for a step jitted on its own
      (:func:`make_train_step`, whose default is None), not inside a loop or
      vmap of yours.
    in_place: let the compiled Mosaic kernel update the kernels and states
      of fused layers that are not stacked (scanned) in their own buffers
      (:func:`forge_jax._src.dense.update_in_place`; stacked layers always
      get fresh outputs). Only when each state leaf is a whole argument of
      the jitted step: not inside a ``lax.scan``/``lax.map`` of yours over
      stacked states (an ensemble), where XLA's GPU dynamic-slice fusion
      gave the in-place kernel wrong results (docs/results.md, stop 22).
      False here; :func:`make_train_step` sets it when its step is called
      on arrays.
    audit: for diagnosis: each ForgeDense (unsharded) also computes the
      unfused reference update on the same layer input and dY and prints
      the relative distance of its own from it (``jax.debug.print``, one
      line per layer and call; ``experiments/check_fused_model --audit``).
      It materializes each dW, so the step needs more memory and time, and
      XLA may compile the step's other arithmetic differently (an fp32 ulp
      on some weights was seen with ``fold_adam``). ForgeEmbed and sharded
      (``kernel_axes``) layers are not audited; under a scan every layer
      prints under the stack's name.

  Returns:
    ``(new_state, metrics)``; metrics hold ``aux``'s entries, ``loss`` and
    ``forge_backward_ok`` (True when every fused backward ran exactly once
    per kernel slice at run time).

  Raises:
    ValueError: if ``order_updates`` is not None, True or False, or
      ``in_place`` or ``audit`` not True or False. At trace
      time (before anything runs or is written) if ``loss_fn`` returns a
      tuple other than ``(loss, aux)``, if a fused
      layer's backward pass was traced zero times (output unused, under
      ``stop_gradient``, layer not called) or more than once (a layer applied
      twice, inside ``lax.cond``, under ``jax.grad`` in the loss), or if the
      loss uses a fused kernel other than through its layer (tied weights, a
      penalty on params).
  """
  paths = fused_kernel_paths(state.forge_state)
  other, fused = split_params(state.params, paths)
  # Each layer's input copy sits in forge_state under its param's own name
  # (dense.KERNEL_INPUT, embed.EMBEDDING_INPUT).
  kernel_inputs = dict(fused)

  # Only the floating-point state is differentiated (its cotangents are the
  # new moments and the probe counts), int8 codes of quantized moments viewed
  # as float8 (a bitcast: JAX allows cotangents of floating arrays only);
  # other integer state, such as a bf16 layer's rounding seed, passes through.
  viewed = quantization.as_float_view(state.forge_state)
  leaves, treedef = jax.tree.flatten(viewed)
  is_diff = [jnp.issubdtype(jnp.result_type(v), jnp.floating) for v in leaves]
  float_state = [v for v, d in zip(leaves, is_diff) if d]
  const_state = [v for v, d in zip(leaves, is_diff) if not d]

  def forge_tree(float_leaves):
    it_f, it_c = iter(float_leaves), iter(const_state)
    return jax.tree.unflatten(
        treedef, [next(it_f) if d else next(it_c) for d in is_diff])

  def objective(other, kernel_inputs, float_state, fused_params):
    # The layers consume `kernel_inputs` (differentiated: their cotangents are
    # the new kernels); `fused_params` is what params shows for the same
    # kernels, not differentiated, and must not reach the loss.
    fs = traverse_util.flatten_dict(dict(forge_tree(float_state)))
    fs.update(kernel_inputs)
    out = loss_fn({"params": merge_params(other, fused_params),
                   FORGE_STATE: traverse_util.unflatten_dict(fs) if fs else {}},
                  batch)
    if isinstance(out, tuple) and len(out) != 2:
      raise ValueError(
          f"loss_fn returned a tuple of {len(out)} values; it must return "
          "loss or (loss, aux)")
    loss, aux = out if isinstance(out, tuple) else (out, {})
    return loss, aux

  kernel_mosaic.check_in_place(in_place)
  if not isinstance(audit, bool):
    raise ValueError(f"audit={audit!r} must be True or False")
  stacked = _stacked_layers(state.forge_state)
  ctx = dense_lib.FusedContext(step=state.step, implementation=implementation,
                               interpret=interpret, seed=state.seed,
                               order_updates=_order_updates(stacked, order_updates),
                               stacked=stacked,
                               in_place=in_place, audit=audit)
  with dense_lib.fused_context(ctx):
    if paths:
      _refuse_other_uses_of_fused_kernels(
          objective, (other, kernel_inputs, float_state, fused))
    (loss, aux), (grads, new_kernels, new_float_state) = jax.value_and_grad(
        objective, argnums=(0, 1, 2), has_aux=True)(
            other, kernel_inputs, float_state, fused)
  _check_backward_traces(ctx, paths)

  updates, opt_state = state.tx.update(grads, state.opt_state, other)
  other = optax.apply_updates(other, updates)

  flat_fs = traverse_util.flatten_dict(dict(forge_tree(new_float_state)))
  counts = [v for k, v in flat_fs.items() if k[-1] == PROBE]
  backward_ok = jnp.all(jnp.stack([jnp.all(c == 1) for c in counts])
                        ) if counts else jnp.asarray(True)
  flat_fs = {k: (jnp.zeros_like(v) if k[-1] == PROBE else v)
             for k, v in flat_fs.items()}
  new_forge_state = quantization.from_float_view(
      traverse_util.unflatten_dict(flat_fs) if flat_fs else {})
  new_fused = {k: new_kernels[k] for k in fused}
  new_state = state.replace(
      step=state.step + 1,
      params=merge_params(other, new_fused),
      forge_state=new_forge_state,
      opt_state=opt_state)
  aux = aux if isinstance(aux, Mapping) else {"aux": aux}
  metrics = {**aux, "loss": loss, "forge_backward_ok": backward_ok}
  return new_state, metrics


def _check_order_updates(order_updates) -> None:
  if order_updates is not None and not isinstance(order_updates, bool):
    raise ValueError(
        f"order_updates={order_updates!r} must be None, True or False")


def _stacked_layers(forge_state) -> frozenset[tuple[str, ...]]:
  """The paths of the fused layers whose state is stacked (nn.scan,
  inplace_scan): their probe is not a scalar."""
  return frozenset(k[:-1] for k, v in traverse_util.flatten_dict(
      dict(forge_state)).items() if k[-1] == PROBE and jnp.ndim(v) > 0)


def _order_updates(stacked: frozenset, order_updates: bool | None) -> bool:
  """fused_step's ``order_updates``, None resolved (off when a fused layer's
  state is stacked)."""
  _check_order_updates(order_updates)
  if order_updates is None:
    return not stacked
  return order_updates


def _refuse_other_uses_of_fused_kernels(objective, args) -> None:
  """Raises if the loss depends on params' copy of a fused kernel.

  Traces the loss once more (trace time only) and asks XLA-independent dead
  code elimination which inputs the loss needs.
  """
  try:
    from jax._src.interpreters import partial_eval as pe  # pylint: disable=g-import-not-at-top
  except ImportError:  # a jax without this module: skip the check
    return
  closed = jax.make_jaxpr(lambda *a: objective(*a)[0])(*args)
  _, used = pe.dce_jaxpr(closed.jaxpr, [True])
  n_before = sum(len(jax.tree.leaves(a)) for a in args[:3])
  fused_keys = sorted(args[3])
  offenders = [fused_keys[i] for i, u in enumerate(used[n_before:]) if u]
  if offenders:
    names = ["/".join(k[:-1]) for k in offenders]
    raise ValueError(
        "fused step refused, nothing was updated: the loss uses the kernel of "
        f"the fused layers {names} other than through the layer itself (tied "
        "weights, a penalty or another computation on params). Its gradient "
        "from that use would be mixed into the fused update. Keep such "
        "kernels unfused (flax Dense, or ForgeDense(optimizer=None))")


def _check_backward_traces(ctx: dense_lib.FusedContext, paths) -> None:
  problems = []
  for p in paths:
    n = ctx.backward_traces.get(p, 0)
    name = "/".join(p) or "<root module>"
    if n == 0:
      problems.append(
          f"{name}: its backward never ran (the layer was not called, its "
          "output does not reach the loss, or it is under stop_gradient); "
          "its kernel would be overwritten with zeros")
    elif n > 1:
      problems.append(
          f"{name}: its backward was traced {n} times (the same layer applied "
          "more than once, a layer inside lax.cond, or jax.grad taken inside "
          "the loss); fused updates would be summed")
  unknown = sorted(set(ctx.backward_traces) - set(paths))
  for p in unknown:
    problems.append(f"{'/'.join(p)}: a fused layer without an entry in "
                    f"{FORGE_STATE!r}")
  if problems:
    raise ValueError(
        "fused step refused, nothing was updated; each fused layer "
        "(ForgeDense, ForgeEmbed) must be used exactly once per step:\n  "
        + "\n  ".join(problems))


class FusedTrainStep:
  """A jitted fused step that checks the run-time backward probe.

  Calling it runs ``jax.jit(fused_step)`` with the state donated and, when
  ``check_backward``, raises if ``metrics['forge_backward_ok']`` is False
  (a fused backward that ran a number of times other than one per kernel at
  run time, e.g. a layer closed over by ``lax.scan``). That check waits for
  the step to finish; pass ``check_backward=False`` to keep dispatch fully
  asynchronous and read the metric yourself. Called inside a jit, loop or
  vmap of yours (a traced state) there is no value to check: read the
  metric yourself there too.
  """

  def __init__(self, jitted, check_backward: bool, jitted_in_trace=None):
    self.jitted = jitted
    self.check_backward = check_backward
    self.jitted_in_trace = jitted if jitted_in_trace is None else jitted_in_trace

  def __call__(self, state: TrainState, batch: Any):
    if not isinstance(state, TrainState):
      raise TypeError(f"state must be a forge_jax.TrainState (TrainState.create), "
                      f"got {type(state).__name__}")
    # Called inside a jit, loop or vmap of the caller's (a traced state), the
    # step is compiled without ordering the updates (fused_step's
    # order_updates: measured only for a step jitted on its own) and without
    # in-place kernels (the caller's loop may slice the state from a stack).
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state))
    new_state, metrics = (self.jitted_in_trace if traced else self.jitted)(
        state, batch)
    if (self.check_backward and not traced
        and not bool(metrics["forge_backward_ok"])):
      raise RuntimeError(
          "a fused layer's backward (ForgeDense, ForgeEmbed) ran a number of "
          "times other than once per weight in this step (a layer reused "
          "inside lax.scan or vmap?). "
          "The state passed in was donated and the returned one is wrong: "
          "restore from a checkpoint")
    return new_state, metrics

  def lower(self, *args, **kwargs):
    return self.jitted.lower(*args, **kwargs)

  def _cache_size(self) -> int:
    return self.jitted._cache_size()  # pylint: disable=protected-access


# The XLA option for scanned models on a GPU; documented in make_train_step's
# docstring (a mapping has no docstring of its own).
SCAN_GPU_COMPILER_OPTIONS = types.MappingProxyType({
    "xla_gpu_enable_triton_gemm": False,
})


def make_train_step(
    loss_fn: LossFn,
    *,
    implementation: str | None = None,
    interpret: bool = False,
    donate: bool = True,
    check_backward: bool = True,
    order_updates: bool | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> FusedTrainStep:
  """``jax.jit`` of :func:`fused_step` with the state donated.

  Donation lets the fused kernels write the new kernels and moments into the
  buffers of the old ones: the state passed in is consumed. The learning
  rate and step count are traced, so a schedule does not recompile. See
  :class:`FusedTrainStep` for ``check_backward``.

  ``order_updates`` is :func:`fused_step`'s (None: the updates are ordered
  unless a fused layer's state is stacked; True: always; False: never),
  applied when the step is called on arrays. Called inside a jit, loop or
  vmap of yours, the step runs with ``order_updates=False`` and
  ``in_place=False`` (the caller's loop may slice the state from a stack).

  ``compiler_options``: XLA options for compiling this step only, as
  ``jax.jit``'s (a dict of XLA debug-option names to values, e.g.
  ``{"xla_gpu_enable_command_buffer": ""}``); None or empty: XLA's defaults.
  Values are str, bool, int or float; XLA parses them when the step is
  compiled (its first call, or ``lower(...).compile()``): an unknown name
  or a bad value raises there. Called inside a jit, loop or vmap of yours,
  the step is part of your computation, compiled with your jit's options
  (JAX takes compiler options at the top level only).

  ``compiler_options=fj.SCAN_GPU_COMPILER_OPTIONS`` is for models with
  scanned layers on a GPU: ``{"xla_gpu_enable_triton_gemm": False}`` (a GPU
  option, which other backends ignore). With XLA's defaults the step copies
  every layer's kernels out of their stacks for its matmuls: 480 device
  copies, 14.3 of 93.9 ms of kernel time, in the scanned Llama-3.1-8B step
  at T=512 (H200; ``docs/results.md``, "Stop 36"). Stop 36's three options
  (this one, XLA's dynamic-slice fusion on and cuBLASLt off) removed them
  (profiled): 80.9 ms per step against 94.4, temp 0.39 against 0.63 GiB.
  XLA's Triton gemms off alone gives the same step time, temp and HLO
  counts of fusions and cuBLASLt calls (80.6 ms, 0.39 GiB; not profiled);
  the pair of the three without it took 94.3 ms, as the defaults do, and
  the two pairs with it 81.0 and 80.9 (``optax.adamw``'s scanned step: 91.0
  under this option, 103.9 under the defaults; "Stops 36 and 37"). Not the
  default: it takes XLA's Triton gemms out of the whole step (every gemm,
  not only the loops'), and it was measured on this model only. Unrolled
  layers have no slices to copy.

  Raises:
    ValueError: if ``loss_fn`` is not callable, ``order_updates`` is not
      None, True or False, or ``compiler_options`` is not a mapping from
      option names (str) to str, bool, int or float values. The step
      raises TypeError when called on anything but a :class:`TrainState`.
  """
  _check_order_updates(order_updates)
  if compiler_options is not None and (
      not isinstance(compiler_options, Mapping)
      or not all(isinstance(k, str) and isinstance(v, (str, bool, int, float))
                 for k, v in compiler_options.items())):
    raise ValueError("compiler_options must be None or a dict from XLA option "
                     "names (str) to str, bool, int or float values, got "
                     f"{compiler_options!r}")
  if not callable(loss_fn):
    raise ValueError(f"loss_fn must be a function (variables, batch) -> scalar "
                     f"loss, got {type(loss_fn).__name__}")

  def step(state, batch, order_updates=order_updates, in_place=True):
    return fused_step(state, batch, loss_fn, implementation=implementation,
                      interpret=interpret, order_updates=order_updates,
                      in_place=in_place)
  donate_argnums = (0,) if donate else ()
  return FusedTrainStep(
      jax.jit(step, donate_argnums=donate_argnums,
              compiler_options=dict(compiler_options or {}) or None),
      check_backward,
      # Inside the caller's trace: JAX refuses compiler options on a nested jit.
      jax.jit(functools.partial(step, order_updates=False, in_place=False),
              donate_argnums=donate_argnums))

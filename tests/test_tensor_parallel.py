"""ForgeDense with its kernel split over a mesh axis (tensor parallelism).

Two CPU devices (conftest sets --xla_force_host_platform_device_count=2):
a column-parallel layer followed by a row-parallel one, trained by the fused
step under ``jax.set_mesh``, against the same model on one device.
"""

import contextlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import forge_jax as fj
from pallas_kernels import quantization
from conftest import rel_err

P = jax.sharding.PartitionSpec


def _mesh(name="model"):
  return jax.make_mesh((2,), (name,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices("cpu")[:2])


class MegatronMLP(nn.Module):
  """fc1 split by columns, fc2 by rows (the Megatron MLP), or unsplit."""

  optimizer: object
  axes: tuple = ((None, "model"), ("model", None))
  width: int = 128
  param_dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x):
    h = fj.ForgeDense(self.width, optimizer=self.optimizer, name="fc1",
                      kernel_axes=self.axes[0], param_dtype=self.param_dtype)(x)
    return fj.ForgeDense(6, optimizer=self.optimizer, name="fc2",
                         kernel_axes=self.axes[1], param_dtype=self.param_dtype)(
                             nn.gelu(h))


def _in_mesh(mesh):
  """``jax.set_mesh(mesh)``, or no mesh context for None."""
  return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def _train(model, variables, batch, *, mesh=None, steps=3, interpret=False,
           implementation=None):
  state = fj.TrainState.create(apply_fn=model.apply,
                               variables=jax.tree.map(jnp.copy, variables),
                               tx=model.optimizer)
  step = fj.make_train_step(
      lambda v, b: jnp.mean((model.apply(v, b[0]) - b[1]) ** 2),
      implementation=implementation, interpret=interpret)
  for _ in range(steps):
    with _in_mesh(mesh):
      state, _ = step(state, batch)
  return state


CASES = {
    "adamw_fp32": (lambda: fj.adamw(1e-2, weight_decay=0.1), jnp.float32),
    "adamw_bf16_sr": (lambda: fj.adamw(1e-2), jnp.bfloat16),
    "adamw_int8": (lambda: fj.adamw(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
                   jnp.float32),
    "fold_adam_l2": (lambda: fj.fold_adam(1e-2, fold_level=2), jnp.float32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_parallel_equals_one_device(rng, on_cpu, name):
  make_tx, param_dtype = CASES[name]
  x = jnp.asarray(rng.standard_normal((4, 5, 16)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((4, 5, 6)), jnp.float32)
  split = MegatronMLP(make_tx(), param_dtype=param_dtype)
  whole = MegatronMLP(make_tx(), axes=((None, None), (None, None)),
                      param_dtype=param_dtype)
  variables = whole.init(jax.random.key(0), x)
  want = _train(whole, variables, (x, y))
  mesh = _mesh()
  got = _train(split, variables, (x, y), mesh=mesh)
  # bf16: the same products and global rounding bits, but a last-bit
  # difference in a shard's fp32 dW can move a rounding by one bf16 step.
  tol = 2e-3 if param_dtype == jnp.bfloat16 else 1e-5
  for a, b in zip(jax.tree.leaves((got.params, got.forge_state)),
                  jax.tree.leaves((want.params, want.forge_state))):
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype == jnp.int8:  # codes: a last-bit difference may move one step
      assert np.mean(np.asarray(a) != np.asarray(b)) < 0.01, name
    elif a.size > 1:
      assert rel_err(a.astype(jnp.float32), b.astype(jnp.float32)) <= tol, name
  # Each device holds half of fc1's kernel (columns) and of fc2's (rows), and
  # the new state is split like its kernel.
  k1 = got.params["fc1"]["kernel"]
  k2 = got.params["fc2"]["kernel"]
  named = lambda *spec: jax.sharding.NamedSharding(mesh, P(*spec))  # noqa: E731
  assert k1.sharding.is_equivalent_to(named(None, "model"), 2)
  assert k2.sharding.is_equivalent_to(named("model", None), 2)
  assert {s.data.shape for s in k1.addressable_shards} == {(16, 64)}
  for layer, split_axis in (("fc1", 1), ("fc2", 0)):  # columns, rows
    for name, leaf in got.forge_state[layer].items():
      if name not in ("mu", "nu"):
        continue
      if isinstance(leaf, quantization.QuantizedArray):
        # int8 codes split like the kernel; their scales, stored
        # transposed (out / 64, in), along the other axis
        assert leaf.scale_transposed
        pairs = [(leaf.codes, split_axis), (leaf.scale, 1 - split_axis)]
      else:
        pairs = [(leaf, split_axis)]
      for a, axis in pairs:
        spec = (None, "model") if axis == 1 else ("model", None)
        assert a.sharding.is_equivalent_to(named(*spec), 2), (layer, name, a.shape)


def test_tensor_parallel_kernel_interpret(rng, on_cpu):
  """The Pallas kernel (interpret mode) inside shard_map: as one device."""
  x = jnp.asarray(rng.standard_normal((2, 3, 16)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((2, 3, 6)), jnp.float32)
  tx = lambda: fj.adamw(1e-2)  # noqa: E731
  split = MegatronMLP(tx(), width=64)
  whole = MegatronMLP(tx(), axes=((None, None), (None, None)), width=64)
  variables = whole.init(jax.random.key(1), x)
  want = _train(whole, variables, (x, y), steps=2, implementation="triton",
                interpret=True)
  got = _train(split, variables, (x, y), mesh=_mesh(), steps=2,
               implementation="triton", interpret=True)
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params)):
    assert rel_err(a, b) <= 1e-5


def test_bf16_stochastic_rounding_is_bit_exact_when_sharded(rng, on_cpu):
  x = jnp.asarray(rng.standard_normal((4, 16)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((4, 6)), jnp.float32)
  tx = lambda: fj.sgd(1e-1)  # noqa: E731  (no state: only the rounding differs)
  split = MegatronMLP(tx(), param_dtype=jnp.bfloat16)
  whole = MegatronMLP(tx(), axes=((None, None), (None, None)),
                      param_dtype=jnp.bfloat16)
  variables = whole.init(jax.random.key(2), x)
  want = _train(whole, variables, (x, y), steps=1)
  got = _train(split, variables, (x, y), mesh=_mesh(), steps=1)
  np.testing.assert_array_equal(
      np.asarray(got.params["fc1"]["kernel"], np.float32),
      np.asarray(want.params["fc1"]["kernel"], np.float32))


def _step_error(model, x, mesh):
  variables = model.init(jax.random.key(0), x)
  with pytest.raises(ValueError) as e:
    _train(model, variables, (x, jnp.zeros((2, 6))), mesh=mesh, steps=1)
  return str(e.value)


def test_data_parallel_axis_is_refused(on_cpu):
  x = jnp.ones((2, 16))
  msg = _step_error(MegatronMLP(fj.adamw(1e-2), axes=((None, None), (None, None))),
                    x, _mesh("data"))
  assert "'data'" in msg and "all-reduced" in msg


@pytest.mark.parametrize("axes,width,match", [
    (((None, "tensor"), ("tensor", None)), 128, "not an axis of the mesh"),
    (((None, "model"), ("model", None)), 127, "does not split evenly"),
    ((("model", "model"), (None, None)), 128, "same mesh axis twice"),
])
def test_bad_kernel_axes_are_refused(on_cpu, axes, width, match):
  model = MegatronMLP(fj.adamw(1e-2), axes=axes, width=width)
  assert match in _step_error(model, jnp.ones((2, 16)), _mesh())


def test_kernel_axes_need_a_mesh(on_cpu):
  model = MegatronMLP(fj.adamw(1e-2))
  assert "jax.set_mesh" in _step_error(model, jnp.ones((2, 16)), None)


def test_fold_block_crossing_a_shard_is_refused(on_cpu):
  # 2 columns per shard of fc1's 4, fold blocks of 4: a block would straddle.
  model = MegatronMLP(fj.fold_adam(1e-2, fold_level=2), width=4)
  assert "fold block" in _step_error(model, jnp.ones((2, 16)), _mesh())


def test_int8_blocks_crossing_a_shard_are_refused(on_cpu):
  model = MegatronMLP(fj.adamw(1e-2, mu_dtype=jnp.int8), width=64)
  assert "multiple of 64" in _step_error(model, jnp.ones((2, 16)), _mesh())


@pytest.mark.parametrize("scan_layers", [True])  # unrolled: MegatronMLP above
def test_llama_tensor_parallel_equals_one_device(rng, on_cpu, scan_layers):
  """LlamaConfig.tensor_parallel_axis: q/k/v/gate/up split by columns, o/down
  by rows, with scanned blocks updated in place; 2 steps equal the unsharded
  model's."""
  import functools  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from forge_jax.models.llama import Llama, LlamaConfig, cross_entropy_loss  # pylint: disable=g-import-not-at-top
  cfg = LlamaConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn_dim=64, max_seq_len=16, scan_layers=scan_layers)
  dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-2))
  whole = Llama(cfg, dense_cls=dense)
  split = Llama(dataclasses.replace(cfg, tensor_parallel_axis="model"),
                dense_cls=dense)
  tokens = jnp.asarray(rng.integers(0, 61, (2, 9)), jnp.int32)
  variables = whole.init(jax.random.key(0), tokens[:, :-1])
  batch = (tokens[:, :-1], tokens[:, 1:])

  def run(model, mesh):
    state = fj.TrainState.create(apply_fn=model.apply,
                                 variables=jax.tree.map(jnp.copy, variables),
                                 tx=optax.adamw(1e-2))
    step = fj.make_train_step(lambda v, b: cross_entropy_loss(
        model.apply(v, b[0]), b[1]))
    for _ in range(2):
      with _in_mesh(mesh):
        state, m = step(state, batch)
      assert bool(m["forge_backward_ok"])
    return state

  want, got = run(whole, None), run(split, _mesh())
  for a, b in zip(jax.tree.leaves((got.params, got.forge_state)),
                  jax.tree.leaves((want.params, want.forge_state))):
    if a.size > 1:
      assert rel_err(a, b) <= 1e-5
  block = got.params["layers"]["block"] if scan_layers else got.params["layers_0"]
  up = block["mlp"]["up_proj"]["kernel"]
  assert {s.data.shape[-1] for s in up.addressable_shards} == {32}  # 64 / 2


def test_explicit_mesh_axes_are_refused(on_cpu):
  mesh = jax.make_mesh((2,), ("model",), axis_types=(jax.sharding.AxisType.Explicit,),
                       devices=jax.devices("cpu")[:2])
  msg = _step_error(MegatronMLP(fj.adamw(1e-2)), jnp.ones((2, 16)), mesh)
  assert "type Auto" in msg


def test_kernel_axes_without_optimizer_are_refused(on_cpu):
  layer = fj.ForgeDense(8, kernel_axes=(None, "model"))
  with pytest.raises(ValueError, match="needs an optimizer"):
    layer.init(jax.random.key(0), jnp.ones((2, 4)))


def test_llama_specs_split_int8_scales_along_their_own_axes():
  # tensor_parallel_specs: codes split like their kernel; scales stored
  # transposed, (layers, out / 64, in), split along the other axis.
  from forge_jax.models.llama import Llama, LlamaConfig, tensor_parallel_specs  # pylint: disable=g-import-not-at-top
  import functools  # pylint: disable=g-import-not-at-top
  P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name
  cfg = LlamaConfig(vocab_size=61, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                    ffn_dim=256, max_seq_len=16, scan_layers=True)
  dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(
      1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8))
  shapes = jax.eval_shape(lambda: Llama(cfg, dense_cls=dense).init(
      jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
  specs = tensor_parallel_specs(shapes, "model")
  block = specs["forge_state"]["layers"]["block"]
  for proj, codes, scale in (
      (block["attn"]["q_proj"], P(None, None, "model"), P(None, "model", None)),
      (block["mlp"]["down_proj"], P(None, "model", None), P(None, None, "model"))):
    for name in ("mu", "nu"):
      assert isinstance(proj[name], quantization.QuantizedArray)
      assert proj[name].scale_transposed
      assert proj[name].codes == codes and proj[name].scale == scale, proj[name]


def test_llama_specs_check_the_split_when_given_the_axis_size():
  """tensor_parallel_specs(..., axis_size=n) refuses a split that does not
  divide, naming the variable (and the int8 blocks), instead of leaving it
  to JAX's indivisible-shape error at the sharded init or to the step."""
  from forge_jax.models.llama import Llama, LlamaConfig, tensor_parallel_specs  # pylint: disable=g-import-not-at-top
  import functools  # pylint: disable=g-import-not-at-top

  def shapes(moments, kv_heads=2, ffn_dim=256):
    # head_dim 32: k/v projections have kv_heads * 32 columns
    cfg = LlamaConfig(vocab_size=61, d_model=128, n_layers=2, n_heads=4,
                      n_kv_heads=kv_heads, ffn_dim=ffn_dim, max_seq_len=16, scan_layers=True)
    dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(
        1e-2, mu_dtype=moments, nu_dtype=moments))
    return jax.eval_shape(lambda: Llama(cfg, dense_cls=dense).init(
        jax.random.key(0), jnp.ones((1, 8), jnp.int32)))

  int8 = shapes(jnp.int8, kv_heads=4)  # k/v: 128 columns, 2 int8 blocks
  assert tensor_parallel_specs(int8, "model", 2) == tensor_parallel_specs(int8, "model")
  assert tensor_parallel_specs(int8, "model", np.int64(2)) == tensor_parallel_specs(int8, "model")
  # k/v with 64 columns: one int8 block, which two devices cannot share
  with pytest.raises(ValueError, match=r"k_proj.*codes.*block of 64 elements.*multiple of 128"):
    tensor_parallel_specs(shapes(jnp.int8), "model", 2)
  # gate/up with 224 columns: 112 per device, not whole blocks
  with pytest.raises(ValueError, match=r"gate_proj.*codes.*\(224\).*multiple of 128"):
    tensor_parallel_specs(shapes(jnp.int8, kv_heads=4, ffn_dim=224), "model", 2)
  # down_proj splits its 224 rows (not the block axis): 112 rows each is fine
  # with bf16 moments, and the same model splits with them
  tensor_parallel_specs(shapes(jnp.bfloat16, ffn_dim=224), "model", 2)
  # a kernel dimension that 3 does not divide: named, no block hint
  with pytest.raises(ValueError, match=r"splits its axis .* over 3 devices of 'model'") as e:
    tensor_parallel_specs(shapes(jnp.bfloat16), "model", 3)
  assert "blocks" not in str(e.value)
  for bad in (0, 2.0, True, "2"):
    with pytest.raises(ValueError, match="axis_size"):
      tensor_parallel_specs(int8, "model", bad)

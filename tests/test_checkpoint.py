"""Orbax checkpoints of a fused TrainState: exact resume, refused mismatches."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import forge_jax as fj
from forge_jax import latest_checkpoint_step


class Net(nn.Module):
  width: int = 12
  param_dtype: object = jnp.float32

  @nn.compact
  def __call__(self, x):
    opt = fj.adamw(optax.cosine_decay_schedule(1e-2, 20), weight_decay=0.05)
    h = nn.tanh(fj.ForgeDense(self.width, optimizer=opt, param_dtype=self.param_dtype,
                              name="fc1")(x))
    return nn.Dense(3, name="head")(h)


def _setup(rng, width=12, param_dtype=jnp.float32):
  model = Net(width, param_dtype)
  x = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((6, 3)), jnp.float32)
  v = model.init(jax.random.key(0), x)
  state = fj.TrainState.create(apply_fn=model.apply, variables=v,
                               tx=optax.adamw(1e-2))
  step = fj.make_train_step(
      lambda v, b: jnp.mean((model.apply(v, b[0]) - b[1]) ** 2))
  return state, step, (x, y)


def _leaves(state):
  return [np.asarray(a) for a in jax.tree.leaves(
      (state.step, state.params, state.forge_state, state.opt_state))]


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16])
def test_resume_is_bit_identical(rng, tmp_path, param_dtype):
  """bf16 kernels too: the stochastic-rounding seed is in the checkpoint."""
  state, step, batch = _setup(rng, param_dtype=param_dtype)
  state = state.replace(seed=jnp.asarray(1234, jnp.uint32))
  template = jax.tree.map(jnp.copy, state)
  for _ in range(3):
    state, _ = step(state, batch)
  fj.save_checkpoint(tmp_path, state, metadata={"note": "three"})
  uninterrupted = state
  for _ in range(2):
    uninterrupted, _ = step(uninterrupted, batch)

  # The metadata alone, without restoring arrays (train_lm --resume compares
  # its configuration first).
  assert fj.checkpoint_metadata(tmp_path) == {"note": "three"}
  restored, meta = fj.restore_checkpoint(tmp_path, template)
  assert meta == {"note": "three"} and int(restored.step) == 3
  for _ in range(2):
    restored, _ = step(restored, batch)
  for a, b in zip(_leaves(restored), _leaves(uninterrupted)):
    np.testing.assert_array_equal(a, b)


def test_restore_into_another_structure_is_refused(rng, tmp_path):
  state, step, batch = _setup(rng)
  state, _ = step(state, batch)
  fj.save_checkpoint(tmp_path, state)
  wider, _, _ = _setup(rng, width=16)
  with pytest.raises(ValueError, match="does not match"):
    fj.restore_checkpoint(tmp_path, wider)
  same, _, _ = _setup(rng)  # same widths, another optax optimizer
  other_opt = same.replace(opt_state=optax.sgd(0.1, momentum=0.9).init(
      {"head": same.params["head"]}))
  with pytest.raises(ValueError, match="does not match"):
    fj.restore_checkpoint(tmp_path, other_opt)


def test_saving_over_a_later_checkpoint_is_refused(rng, tmp_path):
  state, step, batch = _setup(rng)
  first = jax.tree.map(jnp.copy, state)
  state, _ = step(state, batch)
  fj.save_checkpoint(tmp_path, state)  # step 1
  with pytest.raises(FileExistsError, match=r"steps \[1\] >= 0"):
    fj.save_checkpoint(tmp_path, first)  # step 0: another run
  assert latest_checkpoint_step(tmp_path) == 1
  fj.save_checkpoint(tmp_path, first, overwrite=True)
  assert latest_checkpoint_step(tmp_path) == 0


def test_missing_checkpoint_and_unfinished_save(rng, tmp_path):
  state, _, _ = _setup(rng)
  with pytest.raises(FileNotFoundError):
    fj.restore_checkpoint(tmp_path / "nothing", state)
  with pytest.raises(FileNotFoundError):
    fj.checkpoint_metadata(tmp_path / "nothing")
  fj.save_checkpoint(tmp_path, state)
  # A save that died midway leaves only orbax's temporary directory, which is
  # never taken for a checkpoint.
  os.makedirs(tmp_path / "7.orbax-checkpoint-tmp-1234")
  assert latest_checkpoint_step(tmp_path) == 0


def test_int8_scales_restore_only_into_their_own_layout(rng, tmp_path):
  # A checkpoint written before ForgeDense stored its int8 scales transposed
  # (natural layout) is refused by a target with transposed scales, even
  # where both layouts have one shape (in = 2 = 128 / 64 here), and restores
  # through the conversion the error names.
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  model = fj.ForgeDense(128, optimizer=fj.adamw(1e-2, mu_dtype=jnp.int8,
                                                nu_dtype=jnp.int8))
  x = jnp.asarray(rng.standard_normal((6, 2)), jnp.float32)
  y = jnp.asarray(rng.standard_normal((6, 128)), jnp.float32)
  state = fj.TrainState.create(apply_fn=model.apply,
                               variables=model.init(jax.random.key(0), x),
                               tx=optax.adamw(1e-2))
  template = jax.tree.map(jnp.copy, state)
  step = fj.make_train_step(lambda v, b: jnp.mean((model.apply(v, b[0]) - b[1]) ** 2))
  for _ in range(2):
    state, _ = step(state, (x, y))
  is_q = lambda v: isinstance(v, quantization.QuantizedArray)  # noqa: E731
  as_layout = lambda tree, t: jax.tree.map(  # noqa: E731
      lambda v: quantization.with_scale_layout(v, t) if is_q(v) else v, tree,
      is_leaf=is_q)
  assert state.forge_state["mu"].scale_transposed
  assert state.forge_state["mu"].scale.shape == (2, 2)
  old = state.replace(forge_state=as_layout(state.forge_state, False))
  fj.save_checkpoint(tmp_path, old)
  with pytest.raises(ValueError, match="with_scale_layout"):
    fj.restore_checkpoint(tmp_path, template)
  restored, _ = fj.restore_checkpoint(
      tmp_path, template.replace(forge_state=as_layout(template.forge_state, False)))
  restored = restored.replace(forge_state=as_layout(restored.forge_state, True))
  for a, b in zip(_leaves(restored), _leaves(state)):
    np.testing.assert_array_equal(a, b)


def test_metadata_that_json_cannot_write_is_refused_before_writing(rng, tmp_path):
  """A numpy scalar in metadata is refused before orbax writes anything, so
  the same process can save into the same directory right after."""
  state, _, _ = _setup(rng)
  for bad in ({"loss": np.float32(1.5)}, {"ids": np.arange(3)}, [("a", 1)]):
    with pytest.raises(ValueError, match="metadata must be"):
      fj.save_checkpoint(tmp_path, state, metadata=bad)
  assert os.listdir(tmp_path) == [] and latest_checkpoint_step(tmp_path) is None
  fj.save_checkpoint(tmp_path, state, metadata={"loss": 1.5})
  assert fj.checkpoint_metadata(tmp_path) == {"loss": 1.5}


def test_layout_hint_only_for_a_scale_layout_difference(rng, tmp_path):
  """An int8 model restored into a target whose head differs in width: the
  error lists the head, without the hint about int8 scale layouts."""
  class Int8Net(nn.Module):
    out: int

    @nn.compact
    def __call__(self, x):
      h = fj.ForgeDense(128, optimizer=fj.adamw(1e-2, mu_dtype=jnp.int8,
                                                nu_dtype=jnp.int8), name="fc1")(x)
      return nn.Dense(self.out, name="head")(h)

  x = jnp.asarray(rng.standard_normal((6, 4)), jnp.float32)
  states = [fj.TrainState.create(apply_fn=m.apply, variables=m.init(jax.random.key(0), x),
                                 tx=optax.adamw(1e-2))
            for m in (Int8Net(3), Int8Net(5))]
  fj.save_checkpoint(tmp_path, states[0])
  with pytest.raises(ValueError, match=r"head.*kernel.*float32\[128, 3\]") as e:
    fj.restore_checkpoint(tmp_path, states[1])
  assert "with_scale_layout" not in str(e.value)

"""experiments/state_dispatch: the trees it times are the real states' trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import state_dispatch


def _kernels(shapes) -> int:
  """Fused kernels in a state: the forge_state entries that keep a 'mu'."""
  flat = jax.tree_util.tree_flatten_with_path(shapes.forge_state)[0]
  return sum(getattr(p[-1], "key", None) == "mu" for p, _ in flat)


def test_tiny_leaves_follow_the_state_tree():
  shapes = state_dispatch.state_shapes("cpu-tiny", "forge-bf16", "unrolled")
  want = jax.tree.leaves(shapes)
  got = state_dispatch.tiny_leaves(shapes)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g.ndim == w.ndim and g.size == 1
    if jnp.issubdtype(w.dtype, jnp.number):
      assert g.dtype == w.dtype
  # Every fused kernel keeps one probe and one seed: dropped, then two
  # arrays with one element per kernel stand for them.
  n = _kernels(shapes)
  assert n > 0
  dropped = state_dispatch.tiny_leaves(shapes, drop_scalars=True)
  assert len(dropped) == len(want) - 2 * n + 2
  assert [x.shape for x in dropped[-2:]] == [(n,), (n,)]


def test_optax_state_has_no_scalars_to_drop():
  shapes = state_dispatch.state_shapes("cpu-tiny", "optax", "scan")
  assert (len(state_dispatch.tiny_leaves(shapes, drop_scalars=True))
          == len(jax.tree.leaves(shapes)) + 2)


def test_time_step_runs_the_donated_step():
  leaves = [jnp.ones((1, 1), jnp.bfloat16), jnp.zeros((), jnp.uint32)]
  waited, piped = state_dispatch.time_step(leaves, 3)
  assert waited > 0 and piped > 0 and np.isfinite(waited + piped)


def test_main_prints_every_variant(capsys):
  state_dispatch.main(["--model", "cpu-tiny", "--layouts", "scan", "--steps", "2"])
  out = capsys.readouterr().out
  table = [l for l in out.splitlines() if l.startswith("| scan |")]
  assert [l.split(" | ")[1] for l in table] == [
      "optax", "forge-bf16", "forge-int8", "forge-bf16, no scalars"]
  # forge's trees have more leaves than optax's, the int8 one most.
  leaves = [int(l.split(" | ")[2]) for l in table]
  assert leaves[0] < leaves[1] < leaves[2]


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--layouts", "scan,rolled"]])
def test_main_refuses_bad_arguments(argv, capsys):
  with pytest.raises(SystemExit):
    state_dispatch.main(["--model", "cpu-tiny", *argv])
  assert argv[0] in capsys.readouterr().err

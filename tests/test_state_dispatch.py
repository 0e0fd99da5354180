"""experiments/state_dispatch: the trees it times are the real states' trees."""

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import state_dispatch


def _kernels(shapes) -> int:
  """Fused kernels in a state: the forge_state entries that keep a 'mu'."""
  def count(tree) -> int:
    if not isinstance(tree, Mapping):
      return 0
    return 1 if "mu" in tree else sum(count(v) for v in tree.values())
  return count(shapes.forge_state)


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
  assert state_dispatch.scalar_count(shapes) == 2 * n
  dropped = state_dispatch.tiny_leaves(shapes, drop_scalars=True)
  assert len(dropped) == len(want) - 2 * n + 2
  assert [x.shape for x in dropped[-2:]] == [(n,), (n,)]
  # What is dropped is exactly the probes and seeds: the kept leaves are
  # the other leaves, in order (their ranks and dtypes match one by one).
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  names = {p[-1].key for p, _ in flat
           if isinstance(p[-1], jax.tree_util.DictKey)}
  assert {"probe", "rounding_seed", "mu", "nu"} <= names
  kept = [s for p, s in flat
          if not (isinstance(p[-1], jax.tree_util.DictKey)
                  and p[-1].key in ("probe", "rounding_seed"))]
  assert [(x.ndim, x.dtype) for x in dropped[:-2]] == [
      (s.ndim, s.dtype) for s in kept]


def test_optax_state_has_no_scalars_to_drop():
  shapes = state_dispatch.state_shapes("cpu-tiny", "optax", "scan")
  assert (len(state_dispatch.tiny_leaves(shapes, drop_scalars=True))
          == len(jax.tree.leaves(shapes)) + 2)


def test_time_step_runs_the_donated_step():
  leaves = [jnp.ones((1, 1), jnp.bfloat16), jnp.zeros((), jnp.uint32)]
  waited, piped = state_dispatch.time_step(leaves, 3)
  assert waited > 0 and piped > 0 and np.isfinite(waited + piped)
  assert all(x.is_deleted() for x in leaves)  # donated, as the real step's


def test_main_prints_every_variant(capsys):
  state_dispatch.main(["--model", "cpu-tiny", "--layouts", "scan", "--steps",
                       "2", "--repeats", "2"])
  out = capsys.readouterr().out
  table = [l.split(" | ") for l in out.splitlines() if l.startswith("| scan |")]
  assert [r[1] for r in table] == [
      "optax", "forge-bf16", "forge-int8", "forge-bf16, no scalars"]
  shapes = {name: state_dispatch.state_shapes("cpu-tiny", name, "scan")
            for name in ("optax", "forge-bf16", "forge-int8")}
  leaves = [int(r[2]) for r in table]
  scalars = [int(r[3]) for r in table]
  assert leaves[:3] == [len(jax.tree.leaves(shapes[n]))
                        for n in ("optax", "forge-bf16", "forge-int8")]
  assert scalars == [0, 2 * _kernels(shapes["forge-bf16"]),
                     2 * _kernels(shapes["forge-int8"]), 0]
  assert leaves[3] == leaves[1] - scalars[1] + 2
  assert all(float(r[4]) > 0 and float(r[5].rstrip(" |")) > 0 for r in table)


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--layouts", "scan,rolled"]])
def test_main_refuses_bad_arguments(argv, capsys):
  with pytest.raises(SystemExit):
    state_dispatch.main(["--model", "cpu-tiny", *argv])
  assert argv[0] in capsys.readouterr().err

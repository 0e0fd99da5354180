"""experiments/check_fused_model: a model's fused step against the reference."""

import re

import jax
import pytest

from experiments import check_fused_model
from forge_jax._src import dense

ARGS = ["--model", "cpu-tiny", "--layers", "1", "--tokens", "64", "--steps", "1",
        "--interpret"]


def test_parse_variant():
  assert check_fused_model.parse_variant("auto") == ("auto", True, 0)
  assert check_fused_model.parse_variant("mosaic:fresh:seed3") == ("mosaic", False, 3)
  for bad in ("cuda", "auto:inplace", "xla:seedx"):
    with pytest.raises(ValueError, match="IMPL"):
      check_fused_model.parse_variant(bad)


def test_kernels_follow_the_reference_and_the_control_is_not_judged(capsys):
  # int8 moments; --audit: each layer's update on its own inputs too.
  rc = check_fused_model.main(ARGS + ["--variants", "xla,mosaic,xla:seed1",
                                      "--audit", "--moments", "int8"])
  out = capsys.readouterr().out
  assert rc == 0, out
  assert "xla:seed1 (control)" in out
  # The control's rounding bits differ: its change is far from the reference's
  # (marked, but not judged), while the kernels' are not marked at all.
  rows = [r for r in out.splitlines() if r.startswith("| params/")]
  assert rows and all(r.split("|")[2].strip().startswith("1.000 / 0.0") for r in rows)
  assert any("<<" in r.split("|")[3] for r in rows)
  assert "every variant follows the reference" in out
  # 7 projections and the head, once per audited run (mosaic and the
  # control; the reference run is not audited), each near 0.
  audits = [r for r in out.splitlines() if r.startswith("forge audit ")]
  assert len(audits) == 16, audits
  assert all(float(r.split("err ")[1].split(",")[0]) < 0.02 for r in audits), audits


def test_an_update_applied_twice_is_caught(monkeypatch, capsys):
  orig = dense._sharded_update

  def twice(spec, x, dy, kernel, state, hparams, seed):
    kernel, state = orig(spec, x, dy, kernel, state, hparams, seed)
    if spec.implementation == "xla":
      return kernel, state
    return orig(spec, x, dy, kernel, state, hparams, seed)

  monkeypatch.setattr(dense, "_sharded_update", twice)
  rc = check_fused_model.main(ARGS + ["--variants", "xla,mosaic", "--audit"])
  out = capsys.readouterr().out
  assert rc == 1
  # The audit, on each layer's own inputs, sees the second update too.
  audits = [float(r.split("err ")[1].split(",")[0]) for r in out.splitlines()
            if r.startswith("forge audit ")]
  assert audits and min(audits) > 0.5, audits
  assert "DIFFERENT from the reference" in out
  ratios = [float(r.split("|")[2].split("/")[0]) for r in out.splitlines()
            if r.startswith("| params/") and "kernel" in r]
  assert ratios and min(ratios) > 1.5, ratios


def test_bad_variants_are_refused():
  with pytest.raises(SystemExit):
    check_fused_model.main(ARGS + ["--variants", "xla"])
  with pytest.raises(SystemExit):
    check_fused_model.main(ARGS + ["--variants", "xla,cuda"])


def test_refusals_come_before_any_work(capsys):
  for args, message in [
      (["--variants", "xla:seed1,xla:seed2"], "another rounding seed"),
      (["--variants", "xla,xla:seed4294967296"], "2\\*\\*32"),
      (["--model", "bogus", "--variants", "xla,mosaic"], "--model='bogus'"),
  ]:
    with pytest.raises(SystemExit):
      check_fused_model.main(ARGS + args)
    err = capsys.readouterr()
    assert "loss per step" not in err.out
    assert re.search(message, err.err), (args, err.err)
  if jax.default_backend() != "gpu":
    no_interpret = [a for a in ARGS if a != "--interpret"]
    with pytest.raises(SystemExit):
      check_fused_model.main(no_interpret + ["--variants", "xla,mosaic"])
    assert "need a GPU" in capsys.readouterr().err


def test_a_leaf_only_the_variant_moved_is_reported():
  import jax.numpy as jnp
  zeros, ones = jnp.zeros(4), jnp.ones(4)
  out = check_fused_model.compare({"a": zeros, "b": zeros}, {"a": zeros, "b": ones},
                                  {"a": 5 * ones, "b": ones})
  assert out["b"] == (1.0, 0.0)
  assert out["a"] == (float("inf"), float("inf"))


def test_a_scanned_stack_is_compared_layer_by_layer():
  import jax.numpy as jnp
  v0 = jnp.zeros((3, 2, 2))
  ref = jnp.ones((3, 2, 2))
  got = ref.at[1].set(2.0)
  out = check_fused_model.compare({"params/layers/block/w": v0},
                                  {"params/layers/block/w": ref},
                                  {"params/layers/block/w": got})
  assert out == {"params/layers[0]/w": (1.0, 0.0), "params/layers[1]/w": (2.0, 1.0),
                 "params/layers[2]/w": (1.0, 0.0)}

"""The main job end to end on the CPU: metrics, plot, checkpoint, exact resume."""

import json
import os
import warnings

import jax
import numpy as np
import pytest

from experiments import train_lm
from conftest import ON_GPU


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
  # A made-up corpus (nothing from elsewhere): sentences of random words.
  # Read only; one file for the module.
  tmp_path = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  words = ["forge", "fused", "tile", "kernel", "moment", "adam", "jax", "flax",
           "gradient", "register", "update", "weight", "token", "the", "a"]
  text = "\n".join(" ".join(rng.choice(words, size=12)) + "." for _ in range(600))
  path = tmp_path / "corpus.txt"
  path.write_text(text)
  return str(path)


def _cfg(text_file, out, **kw):
  base = dict(preset="cpu-tiny", steps=8, batch_size=4, seq_len=32, warmup_steps=2,
              eval_every=4, eval_batches=2, checkpoint_every=100,
              text_files=(text_file,), out=str(out), cache_dir=str(out) + "-cache")
  return train_lm.TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def default_run(text_file, tmp_path_factory):
  """(summary, run directory) of one uninterrupted run with _cfg's defaults
  (forge-adamw, fp32 params, 8 steps): checked on its own below, and the
  uninterrupted run the float32 resume test compares with. Tests only read it."""
  run = tmp_path_factory.mktemp("default") / "run"
  return train_lm.main(_cfg(text_file, run)), run


def test_train_writes_metrics_plot_and_checkpoint(default_run):
  out, run = default_run
  with open(run / "metrics.json") as f:
    on_disk = json.load(f)
  assert on_disk["summary"] == out["summary"]
  recs = on_disk["records"]
  assert [r["step"] for r in recs] == list(range(1, 9))
  assert all(np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in recs)
  assert [r["step"] for r in recs if "val_loss" in r] == [4, 8]
  assert recs[-1]["loss"] < recs[0]["loss"]  # it learns
  assert on_disk["config"]["optimizer"] == "forge-adamw"
  assert on_disk["fused_layers"] == 7 * 4  # q k v o gate up down, 4 layers
  assert os.path.getsize(run / "loss.png") > 1000
  assert os.path.isdir(run / "checkpoints" / "8")


def _final_checkpoint(out):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  mngr = ocp.CheckpointManager(os.path.join(out, "checkpoints"))
  saved = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
      state=ocp.args.StandardRestore()))["state"]
  return mngr.latest_step(), saved


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_resume_continues_exactly(text_file, tmp_path, param_dtype, request):
  # bfloat16: the fused kernels round the new weights stochastically, so the
  # resumed run must also continue the rounding bits' counter.
  kw = dict(param_dtype=param_dtype)
  if param_dtype == "float32":  # _cfg's defaults: the shared run is this one
    full, full_dir = request.getfixturevalue("default_run")
  else:
    full_dir = tmp_path / "full"
    full = train_lm.main(_cfg(text_file, full_dir, **kw))
  train_lm.main(_cfg(text_file, tmp_path / "split", stop_at=5, **kw))
  resumed = train_lm.main(_cfg(text_file, tmp_path / "split", resume=True, **kw))
  assert [r["step"] for r in resumed["records"]] == list(range(1, 9))
  # The final params, fused kernels and every optimizer state, bit for bit.
  step_a, a_state = _final_checkpoint(full_dir)
  step_b, b_state = _final_checkpoint(tmp_path / "split")
  assert step_a == step_b == 8
  assert jax.tree.structure(a_state) == jax.tree.structure(b_state)
  for x, y in zip(jax.tree.leaves(a_state), jax.tree.leaves(b_state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  for a, b in zip(full["records"], resumed["records"]):
    assert ("val_loss" in a) == ("val_loss" in b)
    for k in ("loss", "val_loss"):
      if k not in a:
        continue
      if ON_GPU:
        # On the H200 one step's reported loss differed by 1.1e-7 relative
        # between two runs whose later losses and final state agreed bit for
        # bit (GPU reductions in the loss); the state check above is exact.
        assert abs(a[k] - b[k]) <= 1e-6 * abs(b[k]), (k, a["step"])
      else:
        assert a[k] == b[k], (k, a["step"])  # bit-identical, not merely close


def test_optax_baseline_trains_the_same_model(text_file, tmp_path):
  fused = train_lm.main(_cfg(text_file, tmp_path / "f", steps=4, eval_every=2))
  plain = train_lm.main(_cfg(text_file, tmp_path / "p", steps=4, eval_every=2,
                             optimizer="optax-adamw"))
  assert plain["num_params"] == fused["num_params"]
  assert plain["fused_layers"] == 0
  # Same init, same data, same AdamW: the losses agree to fp32 rounding.
  for a, b in zip(fused["records"], plain["records"]):
    assert abs(a["loss"] - b["loss"]) < 1e-4


def test_fused_fold_adam_tracks_unfused_fold_adam(text_file, tmp_path):
  """FOAM inside FORGE against FOAM as an optax transform, same model and data."""
  kw = dict(steps=4, eval_every=2, fold_level=3, fold_scale=0.5)
  fused = train_lm.main(_cfg(text_file, tmp_path / "f", optimizer="forge-fold-adam", **kw))
  plain = train_lm.main(_cfg(text_file, tmp_path / "p", optimizer="fold-adam", **kw))
  assert fused["fused_layers"] == 28 and plain["fused_layers"] == 0
  # The same moments; only the step counters of the optax chains differ.
  assert abs(fused["optimizer_state_bytes"] - plain["optimizer_state_bytes"]) < 64
  for a, b in zip(fused["records"], plain["records"]):
    assert abs(a["loss"] - b["loss"]) < 1e-4


def test_fold_embeddings_folds_the_embedding_and_head_too(text_file, tmp_path):
  kw = dict(steps=2, eval_every=2, optimizer="fold-adam", fold_level=3)
  paper = train_lm.main(_cfg(text_file, tmp_path / "p", **kw))
  folded = train_lm.main(_cfg(text_file, tmp_path / "f", fold_embeddings=True, **kw))
  assert np.isfinite([r["loss"] for r in folded["records"]]).all()
  # The embedding (vocab, d_model) and the untied head (d_model, vocab),
  # fp32 mu and nu: folded along the last axis in blocks of 8 (padded).
  m = folded["model"]
  shapes = [(m["vocab_size"], m["d_model"])]
  if not m["tie_embeddings"]:
    shapes.append((m["d_model"], m["vocab_size"]))
  saved = sum(2 * 4 * (a * b - a * -(-b // 8)) for a, b in shapes)
  assert paper["optimizer_state_bytes"] - folded["optimizer_state_bytes"] == saved


@pytest.mark.parametrize("optimizer,kw", [  # optax-adamw: the baseline test above
    ("fold-adam", dict(moment_dtype="int8")),
    ("adafactor", {}), ("muon", {}),
    ("forge-adamw", dict(param_dtype="bfloat16", moment_dtype="int8")),
])
def test_every_optimizer_and_mode_trains(text_file, tmp_path, optimizer, kw):
  out = train_lm.main(_cfg(text_file, tmp_path / "o", steps=4, eval_every=4,
                           warmup_steps=1, optimizer=optimizer, **kw))
  losses = [r["loss"] for r in out["records"]]
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert out["optimizer_state_bytes"] > 0


@pytest.mark.parametrize("kw,match", [
    (dict(optimizer="adafactor", moment_dtype="int8"), "moment_dtype applies to"),
    (dict(param_dtype="float16"), "param_dtype='float16'"),
    (dict(fold_level=-1), "fold_level=-1"),
    (dict(fold_embeddings=True), "fold_embeddings applies to"),
    (dict(preset="huge"), "preset='huge'"),
    (dict(optimizer="sgd"), "optimizer='sgd'"),
    (dict(steps=0), "steps=0"),
    (dict(dtype="float16"), "dtype='float16'"),
    (dict(stop_at=-5), "stop_at=-5"),
    (dict(learning_rate=-1.0), "learning_rate=-1.0"),
    (dict(learning_rate_scale=0.0), "learning_rate_scale=0.0"),
    (dict(init_noise=-1.0), "init_noise=-1.0"),
    (dict(optimizer="muon", muon_learning_rate=-1.0), "muon_learning_rate=-1.0"),
    (dict(fold_scale=float("nan")), "fold_scale=nan"),
    (dict(warmup_steps=-1), "warmup_steps=-1 must be >= 0"),
] + ([] if ON_GPU else [
    (dict(implementation="triton"), "implementation='triton' compiles a GPU kernel"),
]))
def test_bad_config_is_refused(text_file, tmp_path, kw, match):
  with pytest.raises(ValueError, match=match):
    train_lm.main(_cfg(text_file, tmp_path / "bad", **kw))
  assert not os.path.exists(tmp_path / "bad" / "checkpoints")


def test_learning_rate_scale_multiplies_the_preset_rate():
  preset_lr = train_lm.PRESETS["60m"]["learning_rate"]
  cfg = train_lm.resolve(train_lm.TrainConfig(preset="60m", learning_rate_scale=2.0))
  assert cfg.learning_rate == 2 * preset_lr and cfg.learning_rate_scale == 1.0
  assert train_lm.resolve(cfg) == cfg  # folded in once: resolving again changes nothing
  cfg = train_lm.resolve(train_lm.TrainConfig(preset="60m", learning_rate=1e-3,
                                               learning_rate_scale=3.0))
  assert cfg.learning_rate == pytest.approx(3e-3)


def test_init_noise_perturbs_the_start_slightly(text_file, tmp_path):
  runs = {eps: train_lm.main(_cfg(text_file, tmp_path / f"n{eps}", steps=2,
                                  optimizer="optax-adamw", init_noise=eps))
          for eps in (0.0, 1e-4)}
  again = train_lm.main(_cfg(text_file, tmp_path / "again", steps=2,
                             optimizer="optax-adamw"))
  first = {eps: r["records"][0]["loss"] for eps, r in runs.items()}
  assert again["records"][0]["loss"] == first[0.0]  # no noise: the same run
  assert first[1e-4] != first[0.0] and abs(first[1e-4] - first[0.0]) < 1e-2
  assert runs[1e-4]["config"]["init_noise"] == 1e-4


def test_missing_text_file_is_refused(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.txt"):
    train_lm.main(_cfg(str(tmp_path / "nope.txt"), tmp_path / "bad"))


def test_resume_with_another_optimizer_or_config_is_refused(text_file, tmp_path):
  train_lm.main(_cfg(text_file, tmp_path / "r", steps=2))
  # A new run (no --resume) into the directory of an old one.
  with pytest.raises(FileExistsError, match="--resume"):
    train_lm.main(_cfg(text_file, tmp_path / "r", steps=3))
  # Another optimizer (so another state tree) is named as a config change,
  # before the restore would fail on the tree.
  with pytest.raises(ValueError, match=r"another configuration.*optimizer="):
    train_lm.main(_cfg(text_file, tmp_path / "r", steps=3, resume=True,
                       optimizer="optax-adamw"))
  with pytest.raises(ValueError, match=r"another configuration.*learning_rate=0.003 "
                     r"in the checkpoint, 0.1 now"):
    train_lm.main(_cfg(text_file, tmp_path / "r", steps=3, resume=True,
                       learning_rate=0.1))
  fold = tmp_path / "f"
  train_lm.main(_cfg(text_file, fold, steps=2, optimizer="fold-adam"))
  with pytest.raises(ValueError, match=r"fold_embeddings=False in the checkpoint, True now"):
    train_lm.main(_cfg(text_file, fold, steps=3, resume=True,
                       optimizer="fold-adam", fold_embeddings=True))
  # A longer schedule is a legitimate change.
  out = train_lm.main(_cfg(text_file, tmp_path / "r", steps=3, resume=True))
  assert [r["step"] for r in out["records"]] == [1, 2, 3]


def test_a_validation_split_too_short_is_refused_before_training(text_file, tmp_path):
  with pytest.raises(ValueError, match="val split"):
    train_lm.main(_cfg(text_file, tmp_path / "v", batch_size=512))
  assert not os.path.exists(tmp_path / "v" / "checkpoints")


def test_a_warmup_longer_than_the_run_is_reported():
  with pytest.warns(UserWarning, match="never reaches its peak"):
    train_lm.resolve(train_lm.TrainConfig(preset="cpu-tiny", steps=20))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a run longer than its warm-up: silent
    train_lm.resolve(train_lm.TrainConfig(preset="cpu-tiny", steps=31))


def test_a_killed_run_keeps_its_metrics_up_to_its_last_checkpoint(
    text_file, tmp_path, monkeypatch, default_run):
  """metrics.json is written with every checkpoint: a run killed after the
  one at step 4 and resumed keeps steps 1-4, and ends with the
  uninterrupted run's records."""
  build = train_lm.build

  def dying_build(cfg, vocab_size):
    model, mcfg, state, step_fn, eval_loss = build(cfg, vocab_size)
    calls = []

    def step(state, batch):
      calls.append(1)
      if len(calls) == 6:
        raise KeyboardInterrupt("killed")
      return step_fn(state, batch)
    return model, mcfg, state, step, eval_loss

  monkeypatch.setattr(train_lm, "build", dying_build)
  run = tmp_path / "killed"
  with pytest.raises(KeyboardInterrupt):
    train_lm.main(_cfg(text_file, run, checkpoint_every=4))
  with open(run / "metrics.json") as f:
    saved = json.load(f)
  assert [r["step"] for r in saved["records"]] == [1, 2, 3, 4]
  assert saved["summary"]["final_val_loss"] == saved["records"][-1]["val_loss"]
  monkeypatch.setattr(train_lm, "build", build)
  resumed = train_lm.main(_cfg(text_file, run, checkpoint_every=4, resume=True))
  full, _ = default_run
  assert [r["step"] for r in resumed["records"]] == list(range(1, 9))
  for a, b in zip(full["records"], resumed["records"]):
    if ON_GPU:
      assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"])
    else:
      assert a["loss"] == b["loss"]


def test_resume_keeps_the_runs_own_length_and_refuses_nothing_to_do(
    text_file, tmp_path, capsys):
  run = tmp_path / "r"
  train_lm.main(_cfg(text_file, run, steps=4, stop_at=2))
  # No --steps: the checkpoint's 4, not the preset's 300.
  out = train_lm.main(_cfg(text_file, run, steps=None, resume=True))
  assert out["config"]["steps"] == 4
  assert [r["step"] for r in out["records"]] == [1, 2, 3, 4]
  with pytest.raises(ValueError, match="checkpoint is at step 4, and steps=3 "
                     "leaves nothing to train"):
    train_lm.main(_cfg(text_file, run, steps=3, resume=True))
  capsys.readouterr()
  out = train_lm.main(_cfg(text_file, run, steps=5, resume=True))
  printed = capsys.readouterr()
  assert "the checkpoint's run had steps=4" in printed.err
  # The summary is the one line on stdout.
  assert json.loads(printed.out) == {"optimizer": "forge-adamw", **out["summary"]}
  assert [r["step"] for r in out["records"]] == [1, 2, 3, 4, 5]

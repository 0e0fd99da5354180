"""Train a Llama-style model on real text with FORGE's fused AdamW (or another optimizer).

Every attention and MLP projection (q, k, v, o, gate, up, down) is a
``forge_jax.ForgeDense`` whose AdamW update runs inside its own backward pass;
embeddings, norms and the head go through ``optax.adamw``. With
``--optimizer optax-adamw`` the same model (flax Dense, same init) trains
unfused as the baseline.

    python -m experiments.train_lm                      # CPU default, ~2 min
    python -m experiments.train_lm --preset 60m --steps 200   # GPU
    python -m experiments.train_lm --resume             # continue from --out

Writes ``metrics.json`` (per-step loss, val_loss, tokens_per_s, peak_bytes,
config), ``loss.png`` and orbax checkpoints under ``--out``; prints the
progress on stderr and the summary (one JSON line) on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import forge_jax as fj
from forge_jax import data as data_lib
from forge_jax.models import llama

# forge-adamw: the 7 projections fused (ForgeDense), the rest forge_jax.adamw.
# The others train the same model (flax Dense, same init) unfused:
#   optax-adamw: optax.adamw everywhere (the baseline);
#   fold-adam: FOAM's recipe (forge_jax.hybrid_fold_adam): fold_adam at
#     --fold-level with scale --fold-scale on the attention/MLP matrices,
#     AdamW on embeddings and norms; fold-adam-noresidual: without R;
#   adafactor: optax.adafactor (factored second moments);
#   muon: optax.contrib.muon on the attention/MLP matrices, AdamW elsewhere.
#   forge-fold-adam: FOAM inside FORGE: the 7 projections fused with
#     fold_adam (--fold-level, --fold-scale), the rest forge_jax.adamw.
OPTIMIZERS = ("forge-adamw", "forge-fold-adam", "optax-adamw", "fold-adam",
              "fold-adam-noresidual", "adafactor", "muon")
FUSED = ("forge-adamw", "forge-fold-adam")
MOMENT_DTYPES = ("float32", "bfloat16", "int8")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """One training run. ``preset`` fills the fields left as None."""

  preset: str = "cpu-tiny"
  optimizer: str = "forge-adamw"
  steps: int | None = None
  batch_size: int | None = None
  seq_len: int | None = None
  tokenizer: str | None = None
  dtype: str | None = None  # compute dtype
  # Storage of the 7 projection kernels per block (fused or not): a bf16
  # fused kernel is updated in fp32 and written back with stochastic
  # rounding unless stochastic_rounding=False (round to nearest).
  param_dtype: str = "float32"
  stochastic_rounding: bool = True
  # Storage of AdamW's mu and nu for every param (forge-adamw only; the
  # optax-adamw baseline keeps optax's fp32 moments).
  moment_dtype: str = "float32"
  # FOAM (fold-adam*): fold level l and the scale α of the folded group.
  fold_level: int = 2
  fold_scale: float = 0.25
  # fold-adam*: also fold the embedding (and an untied LM head) instead of
  # keeping them on AdamW as the paper does: all matrices folded.
  fold_embeddings: bool = False
  # Muon's learning rate for the matrices (its AdamW part uses learning_rate).
  muon_learning_rate: float = 0.02
  learning_rate: float | None = None
  # Multiplies learning_rate (the preset's when unset); resolve() folds it in
  # and leaves 1.0, so a resolved config shows the rate actually used.
  learning_rate_scale: float = 1.0
  # Relative Gaussian noise on the initial params (0: none). A control for
  # fused-vs-unfused comparisons: 1e-7 changes fp32 weights by about an ulp,
  # as a different summation order does, and shows how far such a run drifts.
  init_noise: float = 0.0
  warmup_steps: int | None = None
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  eval_every: int | None = None
  eval_batches: int | None = None
  checkpoint_every: int | None = None
  text_files: tuple[str, ...] = ()
  corpus: str = "tiny_shakespeare"
  val_fraction: float = 0.1
  seed: int = 0
  implementation: str | None = None  # ForgeDense kernel: xla|triton|mosaic|auto|None
  out: str = "runs/train_lm"
  resume: bool = False
  stop_at: int | None = None  # stop (with a checkpoint) before `steps`
  cache_dir: str | None = None


# Run presets: the model preset plus what the training loop needs.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-tiny": dict(model="cpu-tiny", steps=300, batch_size=16, seq_len=128,
                     tokenizer="byte", dtype="float32", learning_rate=3e-3,
                     warmup_steps=30, eval_every=50, eval_batches=8,
                     checkpoint_every=100),
    "60m": dict(model="60m", steps=1000, batch_size=32, seq_len=512,
                tokenizer="gpt2", dtype="bfloat16", learning_rate=1.5e-3,
                warmup_steps=100, eval_every=50, eval_batches=16,
                checkpoint_every=500),
    "130m": dict(model="130m", steps=2000, batch_size=32, seq_len=1024,
                 tokenizer="gpt2", dtype="bfloat16", learning_rate=1e-3,
                 warmup_steps=200, eval_every=100, eval_batches=16,
                 checkpoint_every=500),
}


def resolve(cfg: TrainConfig) -> TrainConfig:
  """Fills unset fields from the preset and validates the combination."""
  if cfg.preset not in PRESETS:
    raise ValueError(f"preset={cfg.preset!r} must be one of {sorted(PRESETS)}")
  if cfg.optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer={cfg.optimizer!r} must be one of {OPTIMIZERS}")
  preset = PRESETS[cfg.preset]
  filled = {k: preset[k] for k in preset
            if k != "model" and getattr(cfg, k) is None}
  cfg = dataclasses.replace(cfg, **filled)
  if not cfg.learning_rate_scale > 0:
    raise ValueError(f"learning_rate_scale={cfg.learning_rate_scale} must be > 0")
  cfg = dataclasses.replace(
      cfg, learning_rate=cfg.learning_rate * cfg.learning_rate_scale,
      learning_rate_scale=1.0)
  for name in ("steps", "batch_size", "seq_len", "warmup_steps", "eval_every",
               "eval_batches", "checkpoint_every"):
    if getattr(cfg, name) < (0 if name == "warmup_steps" else 1):
      raise ValueError(f"{name}={getattr(cfg, name)} must be "
                       + (">= 0" if name == "warmup_steps" else "positive"))
  if cfg.dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype={cfg.dtype!r} must be 'float32' or 'bfloat16'")
  if cfg.param_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"param_dtype={cfg.param_dtype!r} must be 'float32' or "
                     "'bfloat16'")
  if cfg.moment_dtype not in MOMENT_DTYPES:
    raise ValueError(f"moment_dtype={cfg.moment_dtype!r} must be one of "
                     f"{MOMENT_DTYPES}")
  if cfg.moment_dtype != "float32" and cfg.optimizer not in (
      *FUSED, "fold-adam", "fold-adam-noresidual"):
    raise ValueError(f"moment_dtype applies to forge-adamw and fold-adam, not "
                     f"{cfg.optimizer} (whose optax state stays as optax keeps it)")
  if cfg.fold_embeddings and cfg.optimizer not in ("fold-adam",
                                                   "fold-adam-noresidual"):
    raise ValueError("fold_embeddings applies to fold-adam and "
                     f"fold-adam-noresidual, not {cfg.optimizer}")
  if not 0 <= cfg.fold_level <= 16:
    raise ValueError(f"fold_level={cfg.fold_level} must be in [0, 16]")
  if cfg.stop_at is not None and cfg.stop_at < 1:
    raise ValueError(f"stop_at={cfg.stop_at} must be >= 1")
  if not cfg.learning_rate > 0:
    raise ValueError(f"learning_rate={cfg.learning_rate} must be > 0")
  if not cfg.muon_learning_rate > 0:
    raise ValueError(f"muon_learning_rate={cfg.muon_learning_rate} must be > 0")
  if not 0 <= cfg.fold_scale < float("inf"):
    raise ValueError(f"fold_scale={cfg.fold_scale} must be a number >= 0")
  if cfg.implementation not in (None, "xla", "auto") and jax.default_backend() != "gpu":
    raise ValueError(
        f"implementation={cfg.implementation!r} compiles a GPU kernel, and "
        f"this machine's backend is {jax.default_backend()!r}: leave it unset "
        "or pass 'xla' (the unfused reference computation) on a CPU")
  if not cfg.init_noise >= 0:
    raise ValueError(f"init_noise={cfg.init_noise} must be >= 0")
  if cfg.warmup_steps >= cfg.steps:
    warnings.warn(
        f"warmup_steps={cfg.warmup_steps} >= steps={cfg.steps}: the learning "
        f"rate never reaches its peak {cfg.learning_rate:g} in this run (pass "
        "--warmup-steps to shorten the warm-up)", stacklevel=2)
  return cfg


def model_config(cfg: TrainConfig, vocab_size: int) -> llama.LlamaConfig:
  return llama.get_config(PRESETS[cfg.preset]["model"], vocab_size=vocab_size,
                          max_seq_len=cfg.seq_len, dtype=jnp.dtype(cfg.dtype))


def schedule(cfg: TrainConfig) -> optax.Schedule:
  return optax.warmup_cosine_decay_schedule(
      0.0, cfg.learning_rate, cfg.warmup_steps, max(cfg.steps, cfg.warmup_steps + 1),
      end_value=0.1 * cfg.learning_rate)


# Fields a resumed run may change (the schedule spans --steps, so a larger
# --steps extends it; the others only say where and how often to write).
RESUMABLE_CHANGES = ("steps", "stop_at", "resume", "out", "eval_every",
                     "eval_batches", "checkpoint_every", "implementation",
                     "cache_dir")


def _jsonable(v):
  return json.loads(json.dumps(v))


def unfused_tx(cfg: TrainConfig, lr, hp, moments) -> optax.GradientTransformation:
  """The optax transformation of an unfused ``cfg.optimizer`` (all params)."""
  if cfg.optimizer == "optax-adamw":
    return optax.adamw(lr, **hp)
  if cfg.optimizer in ("fold-adam", "fold-adam-noresidual"):
    # Norm scales are 1-D (plain AdamW either way); the name keeps them so.
    unfolded = dict(unfolded=("norm",)) if cfg.fold_embeddings else {}
    # --moment-dtype is every group's, as for forge-adamw (fp32: optax.adamw).
    adam = ({} if cfg.moment_dtype == "float32"
            else dict(adam_moment_dtype=moments["mu_dtype"]))
    return fj.hybrid_fold_adam(
        lr, cfg.fold_level, cfg.fold_scale, **hp, **unfolded, **moments,
        **adam, residual=cfg.optimizer == "fold-adam")
  if cfg.optimizer == "adafactor":
    # Factored second moments and update clipping (optax's defaults); absolute
    # steps on the same schedule as AdamW (not scaled by the parameter RMS);
    # optax adds weight_decay_rate * param after the learning rate, so it is
    # given as lr * weight_decay, the decoupled decay the others use.
    wd = hp["weight_decay"]
    return optax.adafactor(lr, multiply_by_parameter_scale=False,
                           weight_decay_rate=lambda count: lr(count) * wd)
  if cfg.optimizer == "muon":
    muon_lr = optax.warmup_cosine_decay_schedule(
        0.0, cfg.muon_learning_rate, cfg.warmup_steps,
        max(cfg.steps, cfg.warmup_steps + 1), end_value=0.1 * cfg.muon_learning_rate)
    return optax.partition(
        {"fold": optax.contrib.muon(muon_lr, weight_decay=hp["weight_decay"]),
         "adam": optax.adamw(lr, **hp)},
        fj.fold_adam_labels)
  raise ValueError(f"optimizer={cfg.optimizer!r} must be one of {OPTIMIZERS}")


@functools.partial(jax.jit, static_argnums=1)
def _perturb(params, rel: float, key):
  """Each param times (1 + rel · N(0, 1)), in its own dtype."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, max(len(leaves), 1))
  return jax.tree.unflatten(treedef, [
      (p * (1 + rel * jax.random.normal(k, p.shape, jnp.float32))).astype(p.dtype)
      for p, k in zip(leaves, keys)])


def build(cfg: TrainConfig, vocab_size: int):
  """Model, TrainState and jitted step for ``cfg`` (the step donates state)."""
  mcfg = model_config(cfg, vocab_size)
  lr = schedule(cfg)
  hp = dict(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
  moments = dict(mu_dtype=jnp.dtype(cfg.moment_dtype),
                 nu_dtype=jnp.dtype(cfg.moment_dtype))
  param_dtype = jnp.dtype(cfg.param_dtype)
  if cfg.optimizer in FUSED:
    if cfg.optimizer == "forge-adamw":
      fused = fj.adamw(lr, **hp, **moments)
    else:
      fused = fj.fold_adam(lr, cfg.fold_level, scale=cfg.fold_scale, **hp,
                           **moments)
    base = functools.partial(
        fj.ForgeDense, optimizer=fused, implementation=cfg.implementation,
        stochastic_rounding=cfg.stochastic_rounding)
    # Unfused params (embeddings, norms) use the same AdamW, unfused.
    tx = fj.adamw(lr, **hp, **moments)
  else:
    base, tx = nn.Dense, unfused_tx(cfg, lr, hp, moments)

  def dense_cls(**kw):  # the projections' kernels are stored as param_dtype
    return base(**{**kw, "param_dtype": param_dtype})

  model = llama.Llama(mcfg, dense_cls=dense_cls)
  tokens = jnp.zeros((1, cfg.seq_len), jnp.int32)
  variables = jax.jit(model.init)(jax.random.key(cfg.seed), tokens)
  if cfg.init_noise:
    variables = {**variables, "params": _perturb(
        variables["params"], cfg.init_noise, jax.random.key(cfg.seed + 1))}
  state = fj.TrainState.create(apply_fn=model.apply, variables=variables, tx=tx,
                               seed=cfg.seed)

  def loss_fn(variables, batch):
    logits = model.apply(variables, batch["inputs"])
    return llama.cross_entropy_loss(logits, batch["targets"])

  step = fj.make_train_step(loss_fn, implementation=cfg.implementation)

  @jax.jit
  def eval_loss(params, batch):
    logits = model.apply({"params": params}, batch["inputs"])
    return llama.cross_entropy_loss(logits, batch["targets"])

  return model, mcfg, state, step, eval_loss


def optimizer_state_bytes(state: fj.TrainState) -> int:
  """Bytes of every optimizer state: fused layers' moments (int8 codes and
  their scales included; not their probes, seeds or kernels) plus tx's."""
  skip = {"probe", "rounding_seed"}  # ForgeDense's bookkeeping variables
  fused = sum(x.nbytes for layer in _fused_layers(state.forge_state)
              for name, v in layer.items() if name not in skip
              for x in jax.tree.leaves(v))
  return int(fused + sum(x.nbytes for x in jax.tree.leaves(state.opt_state)))


def _fused_layers(forge_state):
  for path in fj.fused_kernel_paths(forge_state):
    node = forge_state
    for k in path:
      node = node[k]
    yield node


def _peak_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats()
  return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def _evaluate(eval_loss, params, data, cfg) -> float:
  losses = [float(eval_loss(params, jax.tree.map(jnp.asarray, b)))
            for b in data.val_batches(cfg.batch_size, cfg.seq_len, cfg.eval_batches)]
  return float(np.mean(losses))


def _plot(records: list[dict], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([r["step"] for r in records], [r["loss"] for r in records],
          lw=1, label="train loss")
  val = [r for r in records if "val_loss" in r]
  ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-",
          label="val loss")
  ax.set_xlabel("step")
  ax.set_ylabel("cross-entropy (nats/token)")
  ax.set_title(title)
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  tmp = path + ".tmp.png"
  fig.savefig(tmp, dpi=120)
  plt.close(fig)
  os.replace(tmp, path)


def _write_json(path: str, obj: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def _metrics(header: dict, records: list[dict], tokens_per_step: int) -> dict:
  """What ``metrics.json`` holds: the header, a summary, every record."""
  timed = [r["step_s"] for r in records[1:]] or [r["step_s"] for r in records]
  vals = [r for r in records if "val_loss" in r]
  summary = {
      "final_loss": records[-1]["loss"] if records else None,
      "final_val_loss": vals[-1]["val_loss"] if vals else None,
      "median_step_s": float(np.median(timed)) if timed else None,
      "median_tokens_per_s": tokens_per_step / float(np.median(timed)) if timed else None,
      "peak_bytes": max((r.get("peak_bytes", 0) for r in records), default=None) or None,
  }
  return {**header, "summary": summary, "records": list(records)}


def main(cfg: TrainConfig) -> dict:
  """Trains, evaluates, checkpoints; returns the metrics written to disk."""
  ckpt_dir = os.path.join(cfg.out, "checkpoints")
  saved = None  # the checkpoint's configuration, read once
  if cfg.resume and fj.latest_checkpoint_step(ckpt_dir) is not None:
    saved = fj.checkpoint_metadata(ckpt_dir).get("config", {})
    if cfg.steps is None:
      # The run's own length, not the preset's: its schedule spans it.
      cfg = dataclasses.replace(cfg, steps=saved.get("steps"))
  cfg = resolve(cfg)
  os.makedirs(cfg.out, exist_ok=True)
  tokenizer = data_lib.load_tokenizer(cfg.tokenizer, cache_dir=cfg.cache_dir)
  text = data_lib.load_corpus(cfg.corpus, text_files=list(cfg.text_files) or None,
                              cache_dir=cfg.cache_dir)
  data = data_lib.tokenize_corpus(text, tokenizer, val_fraction=cfg.val_fraction,
                                  cache_dir=cfg.cache_dir)
  # Fail now, not at the first evaluation, if a split is too short.
  data.train_batch(0, cfg.batch_size, cfg.seq_len, cfg.seed)
  next(iter(data.val_batches(cfg.batch_size, cfg.seq_len, 1)))
  model, mcfg, state, step_fn, eval_loss = build(cfg, tokenizer.vocab_size)
  n_params = llama.num_params(mcfg)
  fused_layers = len(fj.fused_kernel_paths(state.forge_state))
  state_bytes = optimizer_state_bytes(state)
  records: list[dict] = []
  start = 0
  metrics_path = os.path.join(cfg.out, "metrics.json")
  if not cfg.resume and fj.latest_checkpoint_step(ckpt_dir) is not None:
    raise FileExistsError(
        f"{ckpt_dir!r} holds checkpoints of an earlier run: pass --resume to "
        "continue it, or choose another --out")
  if cfg.resume:
    # The saved configuration first: a changed option is named, instead of
    # surfacing as a state-structure mismatch in the restore. (No
    # checkpoint: checkpoint_metadata raises FileNotFoundError.)
    if saved is None:
      saved = fj.checkpoint_metadata(ckpt_dir).get("config", {})
    now = dataclasses.asdict(cfg)
    changed = {k: (saved[k], now[k]) for k in saved
               if k not in RESUMABLE_CHANGES and k in now
               and _jsonable(saved[k]) != _jsonable(now[k])}
    if changed:
      raise ValueError(
          "--resume: the checkpoint was trained with another configuration "
          "(the run would not continue the same training): " + ", ".join(
              f"{k}={v[0]!r} in the checkpoint, {v[1]!r} now"
              for k, v in sorted(changed.items())))
    state, _ = fj.restore_checkpoint(ckpt_dir, state)
    start = int(state.step)
    end = cfg.steps if cfg.stop_at is None else min(cfg.stop_at, cfg.steps)
    if end <= start:
      raise ValueError(
          f"--resume: the checkpoint is at step {start}, and steps={cfg.steps}"
          + (f", stop_at={cfg.stop_at}" if cfg.stop_at is not None else "")
          + " leaves nothing to train (pass a larger --steps to extend the run)")
    if cfg.steps != saved.get("steps", cfg.steps):
      print(f"train_lm: --resume with steps={cfg.steps}, the checkpoint's run "
            f"had steps={saved['steps']}: the learning-rate schedule now spans "
            f"{cfg.steps} steps", file=sys.stderr)
    if os.path.exists(metrics_path):
      with open(metrics_path) as f:
        records = [r for r in json.load(f)["records"] if r["step"] <= start]
  header = {
      "config": dataclasses.asdict(cfg),
      "model": {k: jnp.dtype(v).name if k in ("dtype", "param_dtype", "logits_dtype") else v
                for k, v in dataclasses.asdict(mcfg).items()},
      "num_params": n_params,
      "fused_layers": fused_layers,
      "optimizer_state_bytes": state_bytes,
      "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind),
      "jax": jax.__version__,
      "train_tokens": int(data.train.size),
      "val_tokens": int(data.val.size),
  }
  tokens_per_step = cfg.batch_size * cfg.seq_len
  print(f"{cfg.optimizer} | {cfg.preset}: {n_params / 1e6:.2f}M params, "
        f"{tokenizer.name} tokens (train {data.train.size:,}, val "
        f"{data.val.size:,}) | {jax.default_backend()} | steps {start}->{cfg.steps}",
        file=sys.stderr)
  end = cfg.steps if cfg.stop_at is None else min(cfg.stop_at, cfg.steps)
  bar = tqdm(range(start, end), initial=start, total=cfg.steps,
             desc=cfg.optimizer, dynamic_ncols=True)
  last_val = None  # no evaluation yet
  for step in bar:
    batch = jax.tree.map(jnp.asarray, data.train_batch(
        step, cfg.batch_size, cfg.seq_len, cfg.seed))
    t0 = time.perf_counter()
    state, m = step_fn(state, batch)
    loss = float(m["loss"])
    dt = time.perf_counter() - t0
    if not bool(m["forge_backward_ok"]):
      raise RuntimeError(f"step {step}: a fused layer's backward did not run "
                         "exactly once; see forge_jax.fused_step")
    if not math.isfinite(loss):
      raise FloatingPointError(f"step {step}: loss is {loss}")
    rec = {"step": step + 1, "loss": loss, "step_s": dt,
           "tokens_per_s": tokens_per_step / dt}
    peak = _peak_bytes()
    if peak is not None:
      rec["peak_bytes"] = peak
    if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
      rec["val_loss"] = _evaluate(eval_loss, state.params, data, cfg)
    records.append(rec)
    last_val = rec.get("val_loss", last_val)
    # "-" until the first evaluation (every --eval-every steps).
    bar.set_postfix(loss=f"{loss:.3f}",
                    val_loss="-" if last_val is None else f"{last_val:.3f}")
    if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == end:
      # The records up to this checkpoint first, so that a run killed at
      # any later point and resumed from it keeps them (a resume drops the
      # records after its checkpoint).
      _write_json(metrics_path, _metrics(header, records, tokens_per_step))
      fj.save_checkpoint(ckpt_dir, state,
                         metadata={"config": dataclasses.asdict(cfg)})
  bar.close()
  # Already on disk: the loop's last step (step + 1 == end) wrote it.
  out = _metrics(header, records, tokens_per_step)
  summary = out["summary"]
  _plot(records, os.path.join(cfg.out, "loss.png"),
        f"{cfg.optimizer}, {cfg.preset} ({n_params / 1e6:.1f}M params)")
  # The result on stdout (one JSON line), the progress on stderr.
  print(json.dumps({"optimizer": cfg.optimizer, **summary}))
  return out


def parse_args(argv=None) -> TrainConfig:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", default=TrainConfig.preset, choices=sorted(PRESETS))
  p.add_argument("--optimizer", default=TrainConfig.optimizer, choices=OPTIMIZERS)
  p.add_argument("--steps", type=int,
                 help="total steps (the cosine schedule spans them; a larger "
                 "--steps with --resume extends the schedule)")
  p.add_argument("--batch-size", type=int)
  p.add_argument("--seq-len", type=int)
  p.add_argument("--tokenizer", choices=data_lib.TOKENIZERS)
  p.add_argument("--dtype", choices=("float32", "bfloat16"),
                 help="compute dtype of the model")
  p.add_argument("--param-dtype", default=TrainConfig.param_dtype,
                 choices=("float32", "bfloat16"),
                 help="storage of the projection kernels (bf16 fused kernels "
                 "are written back with stochastic rounding)")
  p.add_argument("--no-stochastic-rounding", dest="stochastic_rounding",
                 action="store_false",
                 help="round bf16 fused kernels to nearest instead")
  p.add_argument("--fold-level", type=int, default=TrainConfig.fold_level,
                 help="fold-adam: blocks of 2**l elements (FOAM)")
  p.add_argument("--fold-scale", type=float, default=TrainConfig.fold_scale,
                 help="fold-adam: scale α of the folded group")
  p.add_argument("--fold-embeddings", action="store_true",
                 help="fold-adam: fold the embedding and LM head too (every "
                 "matrix folded; the paper keeps them on AdamW)")
  p.add_argument("--muon-learning-rate", type=float,
                 default=TrainConfig.muon_learning_rate)
  p.add_argument("--moment-dtype", default=TrainConfig.moment_dtype,
                 choices=MOMENT_DTYPES,
                 help="storage of every group's moments, for forge-adamw, "
                 "forge-fold-adam, fold-adam and fold-adam-noresidual (fold-adam: "
                 "the folded and the AdamW group; int8: absmax blocks of 64)")
  p.add_argument("--learning-rate", type=float)
  p.add_argument("--init-noise", type=float, default=0.0,
                 help="relative Gaussian noise on the initial params (a "
                 "control run: 1e-7 is about one fp32 ulp)")
  p.add_argument("--learning-rate-scale", type=float, default=1.0,
                 help="multiplies the learning rate (the preset's if "
                 "--learning-rate is not given)")
  p.add_argument("--warmup-steps", type=int)
  p.add_argument("--eval-every", type=int)
  p.add_argument("--eval-batches", type=int)
  p.add_argument("--checkpoint-every", type=int)
  p.add_argument("--corpus", default=TrainConfig.corpus, choices=list(data_lib.CORPORA))
  p.add_argument("--text-files", nargs="+", default=(),
                 help="train on these UTF-8 files instead of the default corpus")
  p.add_argument("--val-fraction", type=float, default=TrainConfig.val_fraction)
  p.add_argument("--seed", type=int, default=TrainConfig.seed)
  p.add_argument("--implementation", choices=("xla", "triton", "mosaic", "auto"))
  p.add_argument("--out", default=TrainConfig.out)
  p.add_argument("--resume", action="store_true",
                 help="continue from the latest checkpoint under --out")
  p.add_argument("--stop-at", type=int,
                 help="stop after this step with a checkpoint (as if preempted)")
  p.add_argument("--cache-dir", default=None)
  a = p.parse_args(argv)
  return TrainConfig(**{k.replace("-", "_"): (tuple(v) if k == "text_files" else v)
                        for k, v in vars(a).items()})


if __name__ == "__main__":
  try:
    main(parse_args())
  except (ValueError, FileExistsError, FileNotFoundError,
          data_lib.DownloadError) as e:
    # A configuration the run refuses, or a corpus or tokenizer that could
    # not be fetched: an argparse-style message, no traceback.
    print(f"train_lm: error: {e}", file=sys.stderr)
    sys.exit(2)

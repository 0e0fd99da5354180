"""Checkpoints of a TrainState through orbax (atomic: a step directory is
written under a temporary name and renamed only when complete)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from pallas_kernels import quantization

TRANSPOSED = " (scale_transposed)"
"""Suffix of an int8 state's scales stored transposed in a saved layout
(``QuantizedArray.scale_transposed``): a checkpoint's scales are restored
only into scales of the same layout, even where both layouts have the same
shape."""


def _arrays(state) -> dict[str, Any]:
  return {"step": state.step, "params": state.params,
          "forge_state": state.forge_state, "opt_state": state.opt_state,
          "seed": state.seed}


def _layout(tree) -> dict[str, str]:
  """Path -> 'dtype[shape]' of every array in ``tree`` (the saved layout),
  int8 scales stored transposed marked with :data:`TRANSPOSED`."""
  is_q = lambda x: isinstance(x, quantization.QuantizedArray)  # noqa: E731
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_q)
  out = {}
  for path, v in flat:
    parts = [(path, v, "")]
    if is_q(v):
      parts = [(path + (jax.tree_util.GetAttrKey("codes"),), v.codes, ""),
               (path + (jax.tree_util.GetAttrKey("scale"),), v.scale,
                TRANSPOSED if v.scale_transposed else "")]
    for p, a, mark in parts:
      out[jax.tree_util.keystr(p)] = (f"{jnp.result_type(a).name}"
                                      f"{list(jnp.shape(a))}{mark}")
  return out


def _compare_layouts(saved: Mapping[str, str], wanted: Mapping[str, str],
                     where: str) -> None:
  """Raises ValueError listing every difference between two layouts."""
  problems = [f"missing from the checkpoint: {k} ({wanted[k]})"
              for k in sorted(set(wanted) - set(saved))]
  problems += [f"not in the target: {k} ({saved[k]})"
               for k in sorted(set(saved) - set(wanted))]
  problems += [f"{k}: checkpoint has {saved[k]}, target wants {wanted[k]}"
               for k in sorted(set(saved) & set(wanted)) if saved[k] != wanted[k]]
  if problems:
    shown = problems[:12] + ([f"... and {len(problems) - 12} more"]
                             if len(problems) > 12 else [])
    hint = ""
    if any((TRANSPOSED in saved[k]) != (TRANSPOSED in wanted[k])
           for k in set(saved) & set(wanted)):  # a layout that differs
      hint = (" Some int8 scales differ in layout: ForgeDense stores its int8 "
              "moments' scales transposed (QuantizedArray.scale_transposed); "
              "checkpoints written by earlier versions of forge_jax hold "
              "them in the natural layout. Restore into a target whose "
              "QuantizedArrays are converted with "
              "pallas_kernels.quantization.with_scale_layout(q, False), then "
              "convert the restored state back with with_scale_layout(q, True).")
    raise ValueError(
        f"checkpoint {where} does not match the target state's structure "
        "(another optimizer, state dtype or width?); nothing was restored:\n  "
        + "\n  ".join(shown) + ("\n" + hint if hint else ""))


def _manager(directory: str | os.PathLike, max_to_keep: int | None = None):
  return ocp.CheckpointManager(
      os.path.abspath(os.fspath(directory)),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save_checkpoint(
    directory: str | os.PathLike,
    state,
    *,
    metadata: Mapping[str, Any] | None = None,
    max_to_keep: int | None = 2,
    overwrite: bool = False,
) -> int:
  """Saves ``state`` (params, fused-layer state, optax state, step, seed).

  Every array is saved in its own dtype (bf16 weights, int8 codes and fp32
  scales of quantized moments, the uint32 rounding seeds), with a JSON
  layout (path, dtype, shape of each) that :func:`restore_checkpoint`
  checks before restoring anything.

  Args:
    directory: checkpoint root; each step is a subdirectory.
    state: a :class:`forge_jax.TrainState`.
    metadata: JSON-serializable extras (config, data position).
    max_to_keep: older steps beyond this many are deleted.
    overwrite: delete checkpoints at this step or later first. Without it,
      such checkpoints (from another run in the same directory) make the
      save fail instead of being silently kept.

  Returns:
    The step number saved.

  Raises:
    ValueError: if ``metadata`` is not a mapping that ``json.dumps`` can
      write (numpy scalars and arrays cannot: convert them with ``float``,
      ``int`` or ``.tolist()``), checked before anything is written.
    FileExistsError: if a checkpoint at this step or later exists and not
      ``overwrite``.
  """
  if metadata is not None and not isinstance(metadata, Mapping):
    raise ValueError(f"metadata must be a mapping, got {type(metadata).__name__}")
  metadata = dict(metadata or {})
  try:
    json.dumps(metadata)
  except (TypeError, ValueError) as e:
    raise ValueError(
        f"metadata must be JSON-serializable (it is saved as JSON): {e}; "
        "convert numpy scalars and arrays with float(), int() or .tolist()"
    ) from e
  step = int(jax.device_get(state.step))
  with _manager(directory, max_to_keep) as mngr:
    later = [s for s in mngr.all_steps() if s >= step]
    if later and not overwrite:
      raise FileExistsError(
          f"{os.fspath(directory)!r} already holds checkpoints at steps "
          f"{sorted(later)} >= {step} (another run?); restore from it, use a "
          "new directory, or pass overwrite=True")
    for s in later:
      mngr.delete(s)
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(_arrays(state)),
        layout=ocp.args.JsonSave(_layout(_arrays(state))),
        metadata=ocp.args.JsonSave(metadata)))
    mngr.wait_until_finished()
  return step


def latest_checkpoint_step(directory: str | os.PathLike) -> int | None:
  """The newest complete step under ``directory``, or None."""
  if not os.path.isdir(directory):
    return None
  with _manager(directory) as mngr:
    return mngr.latest_step()


def checkpoint_metadata(directory: str | os.PathLike,
                        step: int | None = None) -> dict[str, Any]:
  """The ``metadata`` saved with a checkpoint (the latest if ``step`` is None),
  read without restoring any array (e.g. to compare configurations first).

  Raises:
    FileNotFoundError: if there is no complete checkpoint (at ``step``).
  """
  step = latest_checkpoint_step(directory) if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.fspath(directory)!r}")
  with _manager(directory) as mngr:
    if step not in mngr.all_steps():
      raise FileNotFoundError(
          f"no checkpoint at step {step} under {os.fspath(directory)!r}")
    restored = mngr.restore(step, args=ocp.args.Composite(
        metadata=ocp.args.JsonRestore()))
  return dict(restored["metadata"] or {})


def restore_checkpoint(
    directory: str | os.PathLike,
    target,
    *,
    step: int | None = None,
) -> tuple[Any, dict[str, Any]]:
  """Restores into the structure, shapes and dtypes of ``target``.

  Args:
    directory: checkpoint root given to :func:`save_checkpoint`.
    target: a TrainState of the same model and optimizers (its values are
      only used for their structure, shape, dtype and sharding).
    step: the step to restore; the latest if None.

  Returns:
    ``(state, metadata)``.

  Raises:
    FileNotFoundError: if there is no complete checkpoint (at ``step``).
    ValueError: if the checkpoint's arrays differ from ``target``'s in path,
      dtype or shape (another optimizer, state dtype, param dtype or width),
      checked before anything is restored.
  """
  step = latest_checkpoint_step(directory) if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.fspath(directory)!r}")
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(target))
  where = f"step {step} under {os.fspath(directory)!r}"
  with _manager(directory) as mngr:
    if step not in mngr.all_steps():
      raise FileNotFoundError(f"no checkpoint at {where}")
    try:
      saved = mngr.restore(step, args=ocp.args.Composite(
          layout=ocp.args.JsonRestore()))["layout"]
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      raise ValueError(f"checkpoint {where} has no readable layout (not "
                       f"written by forge_jax.save_checkpoint?): {e}") from e
    # orbax would cast to the target's dtypes and restore a matching
    # subtree; a different optimizer, state dtype or width must fail instead.
    _compare_layouts(saved, _layout(_arrays(target)), where)
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract),
          metadata=ocp.args.JsonRestore()))
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
          f"checkpoint step {step} under {os.fspath(directory)!r} does not "
          f"match the target state's structure: {e}") from e
  state = target.replace(**restored["state"])
  return state, dict(restored["metadata"] or {})

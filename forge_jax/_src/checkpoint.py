"""Checkpoints of a TrainState through orbax (atomic: a step directory is
written under a temporary name and renamed only when complete)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp


def _arrays(state) -> dict[str, Any]:
  return {"step": state.step, "params": state.params,
          "forge_state": state.forge_state, "opt_state": state.opt_state,
          "seed": state.seed}


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
    FileExistsError: if a checkpoint at this step or later exists and not
      ``overwrite``.
  """
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
        metadata=ocp.args.JsonSave(dict(metadata or {}))))
    mngr.wait_until_finished()
  return step


def latest_checkpoint_step(directory: str | os.PathLike) -> int | None:
  """The newest complete step under ``directory``, or None."""
  if not os.path.isdir(directory):
    return None
  with _manager(directory) as mngr:
    return mngr.latest_step()


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
    FileNotFoundError: if there is no complete checkpoint.
    ValueError: if the checkpoint's tree does not match ``target``'s.
  """
  step = latest_checkpoint_step(directory) if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint under {os.fspath(directory)!r}")
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _arrays(target))
  with _manager(directory) as mngr:
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

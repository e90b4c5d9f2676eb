"""Orbax checkpoints of a training run: parameters, optimizer state, best-so-far and the log.

Resuming restores the exact state at the saved epoch; together with keys derived by
``fold_in(key, epoch)`` this makes a resumed run end with the same parameters as one that never
stopped.
"""

from __future__ import annotations

import pathlib
from typing import Any, Optional

import orbax.checkpoint as ocp


def manager(directory: str | pathlib.Path, every: int, keep: int = 2) -> ocp.CheckpointManager:
    directory = pathlib.Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=max(every, 1))
    return ocp.CheckpointManager(directory, options=options)


def layout(state: Any) -> list:
    """The shape of every array in ``state``, in tree order: what a checkpoint must match to be
    restored into it."""
    import jax
    return [list(getattr(leaf, "shape", ())) for leaf in jax.tree.leaves(state)]


def save(mgr: ocp.CheckpointManager, epoch: int, state: Any, meta: dict, force=False) -> None:
    meta = {**meta, "layout": layout(state)}
    mgr.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            meta=ocp.args.JsonSave(meta)), force=force)


def restore_latest(mgr: ocp.CheckpointManager, like: Any) -> Optional[tuple[int, Any, dict]]:
    """``(epoch, state, meta)`` of the latest checkpoint, or None. ``like`` gives the pytree
    structure (e.g. freshly initialised state). ValueError, before any array is read, if the
    checkpoint holds other shapes (another model or optimizer): orbax's own errors for that
    are pages long."""
    step = mgr.latest_step()
    if step is None:
        return None
    meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    saved = meta.get("layout")
    if saved is not None and saved != layout(like):
        raise ValueError(f"the checkpoint in {mgr.directory} (epoch {step}) was saved for "
                         "another model or optimizer: its arrays have other shapes than this "
                         "run's; use a new checkpoint directory, or the model it was saved for")
    restored = mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore()))
    return step, restored["state"], restored["meta"]

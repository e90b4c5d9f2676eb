"""Orbax checkpoints of a training run: parameters, optimizer state, best-so-far and the log;
and a run's final parameters alone (`save_params` / `restore_params`).

Resuming restores the exact state at the saved epoch; together with keys derived by
``fold_in(key, epoch)`` this makes a resumed run end with the same parameters as one that never
stopped.
"""

from __future__ import annotations

import pathlib
from typing import Any, Optional

import orbax.checkpoint as ocp


class CheckpointMismatch(ValueError):
    """A checkpoint that this run must not resume: another model, graph or selection rule, or
    an epoch past the run's end. The message says which and what to do."""


def graph_differences(saved: dict, current: dict) -> list[str]:
    """What differs between two `jgrind.Graph.fingerprint` records, in words (empty if
    nothing does)."""
    sizes = [k for k in ("nodes", "edges", "features", "classes", "multilabel")
             if saved.get(k) != current.get(k)]
    if sizes:
        return [f"{k} {saved.get(k)} -> {current.get(k)}" for k in sizes]
    return [f"its {k.removesuffix('_crc')} differ" for k in ("edges_crc", "features_crc",
                                                              "labels_crc", "masks_crc")
            if saved.get(k) != current.get(k)]


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


def restore_latest(mgr: ocp.CheckpointManager, like: Any,
                   graph: Optional[dict] = None) -> Optional[tuple[int, Any, dict]]:
    """``(epoch, state, meta)`` of the latest checkpoint, or None. ``like`` gives the pytree
    structure (e.g. freshly initialised state). `CheckpointMismatch`, before any array is
    read, if the checkpoint was trained on another graph than ``graph`` (a
    `jgrind.Graph.fingerprint`; checked first, since another graph's sizes would also give
    other shapes), or holds other shapes (another model or optimizer): orbax's own errors for
    that are pages long. A checkpoint that records no graph (an older jgrind's) is resumed
    with a warning."""
    step = mgr.latest_step()
    if step is None:
        return None
    meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if graph is not None and "graph" not in meta:
        import warnings
        warnings.warn(f"the checkpoint in {mgr.directory} was saved by an older jgrind and "
                      "records no fingerprint of its graph, so resuming cannot check that the "
                      "graph is the same (OGB folders of ogbn-products and ogbn-proteins now "
                      "load undirected, as OGB's own loaders do)", stacklevel=3)
    differ = graph_differences(meta["graph"], graph) if graph is not None and "graph" in meta \
        else []
    if differ:
        raise CheckpointMismatch(f"the checkpoint in {mgr.directory} was trained on another "
                                 f"graph ({'; '.join(differ)}); resume it on the graph "
                                 "it was trained on, or use a new checkpoint directory")
    saved = meta.get("layout")
    if saved is not None and saved != layout(like):
        raise CheckpointMismatch(f"the checkpoint in {mgr.directory} (epoch {step}) was saved "
                                 "for another model or optimizer: its arrays have other shapes "
                                 "than this run's; use a new checkpoint directory, or the "
                                 "model it was saved for")
    restored = mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(like), meta=ocp.args.JsonRestore()))
    return step, restored["state"], restored["meta"]


def save_params(directory: str | pathlib.Path, epoch: int, params: Any, best_params: Any,
                meta: dict) -> None:
    """A run's final parameters (and its best ones), without the optimizer state, in the layout
    `restore_params` reads: what ``jgrind train`` keeps in ``OUT/params/seed*``."""
    mgr = manager(directory, every=1, keep=1)
    try:
        save(mgr, epoch, {"params": params, "best_params": best_params}, meta, force=True)
        mgr.wait_until_finished()
    finally:
        mgr.close()


def restore_params(directory: str | pathlib.Path, like: Any) -> Optional[tuple[Any, Any, dict]]:
    """``(params, best_params, meta)`` of the latest checkpoint in ``directory`` (None if there
    is none), as pytrees shaped like ``like`` (abstract arrays will do); ``meta`` gains the
    checkpoint's ``epoch``. The optimizer state is not needed. ValueError if the checkpoint's
    parameters have other shapes than ``like``'s."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    mgr = ocp.CheckpointManager(pathlib.Path(directory).absolute())
    try:
        step = mgr.latest_step()
        if step is None:
            return None
        restored = mgr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    finally:
        mgr.close()
    state, meta = restored["state"], restored["meta"]
    treedef, shapes = jax.tree.structure(like), layout(like)
    trees = []
    for name in ("params", "best_params"):
        leaves = jax.tree.leaves(state[name])
        if [list(np.shape(leaf)) for leaf in leaves] != shapes:
            raise ValueError(f"the checkpoint in {directory} (epoch {step}) was saved for "
                             f"another model: its {name} have the shapes "
                             f"{[list(np.shape(leaf)) for leaf in leaves]}, not {shapes}; pass "
                             "the model it was trained with")
        trees.append(jax.tree.unflatten(treedef, [jnp.asarray(leaf) for leaf in leaves]))
    return trees[0], trees[1], {**meta, "epoch": step}

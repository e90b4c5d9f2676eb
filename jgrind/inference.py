"""Using trained parameters: logits or node embeddings for every node (`predict`), in memory or
partition by partition, and the parameters a checkpoint holds (`load_checkpoint`).

    result = jgrind.train(key, graph, model, optimizer, epochs=200)
    logits = jgrind.predict(graph, model, result.best_params)            # [N, C]
    hidden = jgrind.predict(graph, model, result.best_params, layer=1)   # [N, hidden]
    # a graph too large for the device: the same numbers, partition by partition
    hidden = jgrind.predict(graph, model, params, layer=1, num_parts=16,
                            policy=jgrind.policies.ssd_offload("/mnt/nvme"))
"""

from __future__ import annotations

import pathlib
from typing import Optional

import jax
import numpy as np

from jgrind import checkpoint as ckpt
from jgrind.graph import Graph
from jgrind.models.model import GNN, Params
from jgrind.train import Executor, make_executor


def predict(graph: Graph, model: GNN, params: Params, *, layer: Optional[int] = None,
            executor: Optional[Executor] = None, policy=None, num_parts: Optional[int] = None,
            store=None, device_budget: Optional[int] = None, host_budget: Optional[int] = None,
            partitioner=None) -> np.ndarray:
    """Logits ``[N, C]`` of every node, in the graph's node order, dropout off; with
    ``layer``, the output of the model's first ``layer`` layers instead (node embeddings:
    0 is the features, the number of layers the logits).

    ``executor``: an executor already built for ``graph`` and ``model`` (`jgrind.train`'s, an
    `OutOfCore`); otherwise one is made from the out-of-core arguments, as `train` makes
    them (`make_executor`: in memory when none is given), and closed afterwards, so that an
    SSD store's files are removed."""
    model.check_fits(graph)
    if layer is not None:
        model.check_layer(layer)
    check_params(model, params)
    owned = executor is None
    if owned:  # no optimizer: nothing is trained
        executor = make_executor(graph, model, None, policy=policy,
                                 num_parts=num_parts, store=store, device_budget=device_budget,
                                 host_budget=host_budget, partitioner=partitioner)
    try:
        if layer is None:
            return executor.predict(params)
        return executor.embed(params, layer)
    finally:
        if owned and hasattr(executor, "close"):
            executor.close()


def check_params(model: GNN, params: Params) -> None:
    """ValueError unless ``params`` has the structure and shapes ``model.init`` gives."""
    expected = jax.eval_shape(model.init, jax.random.key(0))
    try:
        same = jax.tree.structure(expected) == jax.tree.structure(params) and all(
            tuple(e.shape) == tuple(np.shape(p))
            for e, p in zip(jax.tree.leaves(expected), jax.tree.leaves(params)))
    except Exception:  # noqa: BLE001 - anything that is not a pytree of arrays
        same = False
    if not same:
        raise ValueError(f"these parameters do not fit the {model.name} model: their shapes "
                         f"{ckpt.layout(params)} are not its {ckpt.layout(expected)}; pass the "
                         "model they were trained for")


def load_checkpoint(directory: str | pathlib.Path, model: GNN) -> tuple[Params, Params, dict]:
    """``(params, best_params, meta)`` from the latest checkpoint in ``directory`` for
    ``model``: a `train` checkpoint (``checkpoint_dir``), or a ``jgrind train`` run folder's
    ``params/seed*``. The parameters after the saved epoch, those at the best epoch so far, and
    ``meta``: ``epoch`` and ``best`` (its epoch, val and test metric); a training checkpoint
    adds ``history``, ``select`` and ``stale``, a run folder's ``split``. Needs neither the
    optimizer nor the graph."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint folder {directory}")
    like = jax.eval_shape(model.init, jax.random.key(0))
    restored = ckpt.restore_params(directory, like)
    if restored is None:
        raise FileNotFoundError(f"{directory} holds no checkpoint; train with checkpoint_dir= "
                                "to write one")
    return restored
